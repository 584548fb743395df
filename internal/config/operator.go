package config

// OperatorConfig is the configuration of the operator's CLI (cmd/lockstep).
// It reads any of the binaries' files, so an operator points it at the
// worker's or the scheduler's configuration: the redis and lock sections
// locate the state; the scheduler and schedules sections are validated as
// the scheduler does, and the worker and demo sections are accepted as they
// are.
type OperatorConfig struct {
	SchedulerConfig `yaml:",inline"`
	Worker          WorkerSettings `yaml:"worker"`
	Demo            DemoSettings   `yaml:"demo"`
}

// LoadOperator loads the operator's configuration like LoadScheduler.
func LoadOperator(path string, env func(string) (string, bool)) (*OperatorConfig, error) {
	c := &OperatorConfig{SchedulerConfig: *DefaultScheduler(), Worker: DefaultWorker().Worker, Demo: DefaultWorker().Demo}
	if err := load(path, env, c); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *OperatorConfig) check(v *validator) { c.SchedulerConfig.check(v) }
