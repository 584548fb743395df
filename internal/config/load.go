package config

import (
	"errors"
	"io/fs"
	"os"
	"reflect"
)

// LoadWorker loads the worker configuration: defaults, then the YAML file at
// path (no file when path is ""), then LOCKSTEP_* variables looked up with
// env (os.LookupEnv in production; nil for none), then validation. It reads
// redis.password_file. Every error is an *Error or several joined.
func LoadWorker(path string, env func(string) (string, bool)) (*WorkerConfig, error) {
	c := DefaultWorker()
	if err := load(path, env, c); err != nil {
		return nil, err
	}
	return c, nil
}

// LoadScheduler loads the scheduler configuration like LoadWorker.
func LoadScheduler(path string, env func(string) (string, bool)) (*SchedulerConfig, error) {
	c := DefaultScheduler()
	if err := load(path, env, c); err != nil {
		return nil, err
	}
	return c, nil
}

// checker validates a loaded configuration and completes it (password file,
// per-schedule defaults).
type checker interface{ check(*validator) }

func load(path string, env func(string) (string, bool), c checker) error {
	v := reflect.ValueOf(c).Elem()
	o := origins{}
	var errs []error
	if path != "" {
		src := origin{file: path}
		data, err := os.ReadFile(path)
		if err != nil {
			return src.error("", "cannot read config", cause(err))
		}
		errs = decodeDoc(data, src, v, fieldPath{}, o)
	}
	if env != nil {
		errs = append(errs, applyEnv(v, fieldPath{}, env, o)...)
	}
	if len(errs) == 0 { // validating half-decoded values would only add noise
		val := validator{file: path, origins: o}
		c.check(&val)
		errs = val.errs
	}
	return join(errs)
}

// join keeps a single error as it is, so that callers can type-assert it.
func join(errs []error) error {
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}

// cause drops the path and operation from a file error: the message names
// the file already, and errors.Is(err, fs.ErrNotExist) still holds.
func cause(err error) error {
	if pe, ok := errors.AsType[*fs.PathError](err); ok {
		return pe.Err
	}
	return err
}
