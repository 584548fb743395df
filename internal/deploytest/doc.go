// Package deploytest checks the files in deploy/ against the code, and runs
// the dashboard's and alert rules' queries on a real Prometheus.
//
// The package is for tests only. It offers:
//
//   - LoadDashboard and LoadRules: every PromQL expression of the Grafana
//     dashboard (panels, template variables, annotations) and of the alert
//     rules, with Grafana's variables expanded so Prometheus can run them.
//   - StartPrometheus: a private prometheus server (Debian's binary) on a free
//     loopback port, scraping the targets it is given, with a private data
//     directory, killed in t.Cleanup. Query evaluates PromQL through its HTTP
//     API; Rules reports how the loaded rules evaluate.
//
// Its own tests check that the deploy files agree with the code: ports,
// config keys and LOCKSTEP_* variables (loaded through the config package),
// binary paths, probe paths and metric and label names (against what
// metrics.New registers and what asynq's queue collector exports); that
// promtool accepts and passes the alert rules and their unit tests; and that
// the Redis of compose.yaml and of k8s/ keeps its data on a volume, checked
// by killing and restarting a redis-server started with their own arguments;
// every query parses and evaluates on a Prometheus scraping an in-process
// metrics server, and again, end to end, on a Prometheus scraping two
// scheduler and two worker binaries (built by the test) that run demo jobs on
// a private Redis.
//
// When prometheus or promtool is not installed, the tests fail with a message
// that says how to install them (`make test` does); they never skip.
package deploytest
