// Package acltest runs the real worker, scheduler and lockstep binaries
// against a real redis-server the way docs/operations.md#security tells an
// operator to secure it: under the Redis ACL users of deploy/redis-acl.conf,
// loaded exactly as shipped (plus a password), and over TLS with a CA the
// test generates. It holds tests only.
//
// The ACL test is the proof that the documented rules are enough (the demo
// jobs complete, the CLI answers, Redis logs no denial) and that they matter
// (the CLI under its rules less one fails with NOPERM).
package acltest
