package lock

import "context"

type ownerKey struct{}

// WithOwner returns a context whose acquires are reentrant for owner: an
// acquire of a lock that owner already holds succeeds and counts one more
// hold; the lock is freed when every hold was released.
func WithOwner(ctx context.Context, owner string) context.Context {
	return context.WithValue(ctx, ownerKey{}, owner)
}

// OwnerFrom returns the owner id carried by ctx, or "".
func OwnerFrom(ctx context.Context) string {
	o, _ := ctx.Value(ownerKey{}).(string)
	return o
}
