package scheduler

// withHooks installs tests' hooks on a Scheduler (see hooks).
func withHooks(h hooks) Option { return func(s *Scheduler) { s.hooks = h } }
