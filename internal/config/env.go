package config

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
)

const envPrefix = "LOCKSTEP_"

// envName is the variable that overrides the field at key:
// "redis.tls.ca_file" is LOCKSTEP_REDIS_TLS_CA_FILE.
func envName(key string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// applyEnv overrides each field of v whose LOCKSTEP_* variable is set, even
// to "". A scalar takes the text; a map takes "name=value,name=value" or a
// YAML/JSON mapping; a list takes a YAML/JSON document and replaces the list,
// and a list of strings also takes "a,b,c".
func applyEnv(v reflect.Value, p fieldPath, lookup func(string) (string, bool), o origins) []error {
	var errs []error
	for _, f := range fields(v) {
		fp := p.field(f.name)
		if f.v.Kind() == reflect.Struct {
			errs = append(errs, applyEnv(f.v, fp, lookup, o)...)
			continue
		}
		name := envName(fp.key)
		s, ok := lookup(name)
		if !ok {
			continue
		}
		src := origin{env: name}
		switch k := f.v.Kind(); {
		case k == reflect.Slice && f.v.Type().Elem().Kind() == reflect.String && !isDoc(s):
			setList(f.v, s, fp, src, o)
		case k == reflect.Slice, k == reflect.Map && strings.HasPrefix(strings.TrimSpace(s), "{"):
			errs = append(errs, decodeDoc([]byte(s), src, f.v, fp, o)...)
		case k == reflect.Map:
			errs = append(errs, setPairs(f.v, s, fp, src, o)...)
		default:
			if err := setScalar(f.v, s); err != nil {
				errs = append(errs, src.error(fp.show, err.Error(), nil))
			}
			o[fp.key] = src
		}
	}
	return errs
}

// isDoc reports whether s is a YAML/JSON list rather than comma-separated values.
func isDoc(s string) bool {
	s = strings.TrimSpace(s)
	return strings.HasPrefix(s, "[") || strings.HasPrefix(s, "- ") || strings.Contains(s, "\n")
}

// setList replaces string list v with values separated by commas.
func setList(v reflect.Value, s string, p fieldPath, src origin, o origins) {
	o.forget(p.key)
	o[p.key] = src
	list := reflect.MakeSlice(v.Type(), 0, strings.Count(s, ",")+1)
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			list = reflect.Append(list, reflect.ValueOf(item).Convert(v.Type().Elem()))
		}
	}
	v.Set(list)
}

// setPairs replaces map v with "name=value" pairs separated by commas.
func setPairs(v reflect.Value, s string, p fieldPath, src origin, o origins) []error {
	o.forget(p.key)
	o[p.key] = src
	var errs []error
	m := reflect.MakeMap(v.Type())
	for pair := range strings.SplitSeq(s, ",") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		k, val, ok := strings.Cut(pair, "=")
		k = strings.TrimSpace(k)
		key := reflect.ValueOf(k).Convert(v.Type().Key())
		switch {
		case !ok:
			errs = append(errs, src.error(p.show, fmt.Sprintf("invalid entry %q (want name=value)", strings.TrimSpace(pair)), nil))
			continue
		case m.MapIndex(key).IsValid():
			errs = append(errs, src.error(p.show, fmt.Sprintf("duplicate key %q", k), nil))
			continue
		}
		e := reflect.New(v.Type().Elem()).Elem()
		if err := setScalar(e, val); err != nil {
			errs = append(errs, src.error(p.field(k).show, err.Error(), nil))
			continue
		}
		m.SetMapIndex(key, e)
		o[p.field(k).key] = src
	}
	v.Set(m)
	return errs
}

// otherEnv are the LOCKSTEP_* variables that set no configuration key but
// are Lockstep's all the same.
var otherEnv = map[string]bool{
	"LOCKSTEP_LOCAL_DURATION":     true, // cmd/local: how long make run runs
	"LOCKSTEP_BENCH_HOLD":         true, // the benchmarks' hold
	"LOCKSTEP_TEST_KNOWN_DEFECTS": true, // a test that shows a known defect
}

// envNames adds the variable of every configuration key of v to out.
func envNames(v reflect.Value, p fieldPath, out map[string]bool) {
	for _, f := range fields(v) {
		fp := p.field(f.name)
		if f.v.Kind() == reflect.Struct {
			envNames(f.v, fp, out)
			continue
		}
		out[envName(fp.key)] = true
	}
}

// CheckEnv returns an *Error (joined) naming every LOCKSTEP_ variable of environ
// ("NAME=value" entries, as os.Environ gives them) that sets no key of
// either binary's configuration: a misspelt variable is refused as an
// unknown YAML key is, not silently ignored. A key of the other binary (a
// worker's variable in the scheduler's environment) is accepted: one set of
// variables often serves both.
func CheckEnv(environ []string) error {
	known := map[string]bool{}
	envNames(reflect.ValueOf(&WorkerConfig{}).Elem(), fieldPath{}, known)
	envNames(reflect.ValueOf(&SchedulerConfig{}).Elem(), fieldPath{}, known)
	var unknown []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, envPrefix) && !known[name] && !otherEnv[name] {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	errs := make([]error, len(unknown))
	for i, name := range unknown {
		errs[i] = &Error{Env: name, Msg: "unknown variable: it sets no configuration key (docs/configuration.md lists them)"}
	}
	return errors.Join(errs...)
}
