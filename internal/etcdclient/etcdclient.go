// Package etcdclient is the etcd back end's link to etcd: it adapts
// go.etcd.io/etcd/client/v3 to lock.EtcdClient, builds the client that
// lock.etcd configures, and registers that back end with the configuration
// (config.RegisterEtcd) when linked. It is the only package that imports
// etcd's client, so a program links etcd and gRPC only when it imports this
// package (through the public package etcd, or a binary that accepts
// lock.backend etcd).
package etcdclient

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/lockstep-dev/lockstep/internal/config"
	"github.com/lockstep-dev/lockstep/internal/lock"
)

func init() { config.RegisterEtcd(newLocker) }

// NewLocker returns lock.NewEtcd over cl.
func NewLocker(cl *clientv3.Client, opts ...lock.Option) *lock.Locker {
	return lock.NewEtcd(Wrap(cl), opts...)
}

// newLocker is config's etcd back end: a new client for e, and a Locker over
// it; close stops the Locker's watch and closes the client.
func newLocker(e config.EtcdConfig, opts []lock.Option) (*lock.Locker, func() error, error) {
	cfg, err := ClientConfig(e)
	if err != nil {
		return nil, nil, err
	}
	cl, err := clientv3.New(cfg)
	if err != nil {
		return nil, nil, &config.Error{Field: "lock.etcd.endpoints", Msg: "cannot create the etcd client", Err: err}
	}
	l := NewLocker(cl, opts...)
	return l, func() error { return errors.Join(l.Close(), cl.Close()) }, nil
}

// The etcd client's gRPC keep-alive: a member that stops answering (a
// frozen process, a black-holed network) keeps its TCP connection open, so
// without pings the client's calls would go on being sent to it. gRPC pings
// no more often than every 10s; etcd's server accepts pings every 5s
// (--grpc-keepalive-min-time) while a stream is open, which the Locker's
// watch is.
const (
	keepAliveTime    = 10 * time.Second
	keepAliveTimeout = 2 * time.Second
)

// ClientConfig returns the etcd client configuration for e: endpoints (a
// bare host:port gets the scheme TLS implies), credentials (reading
// PasswordFile if the config was built by hand rather than loaded), TLS, the
// dial timeout and gRPC keep-alive pings. The client dials in the background
// and logs nothing: its errors reach the Locker's callers.
func ClientConfig(e config.EtcdConfig) (clientv3.Config, error) {
	c, err := e.Connection()
	if err != nil {
		return clientv3.Config{}, err
	}
	scheme := "http://"
	if c.TLS != nil {
		scheme = "https://"
	}
	eps := make([]string, len(e.Endpoints))
	for i, ep := range e.Endpoints {
		if !strings.Contains(ep, "://") {
			ep = scheme + ep
		}
		eps[i] = ep
	}
	return clientv3.Config{
		Endpoints:   eps,
		Username:    e.Username,
		Password:    c.Password,
		TLS:         c.TLS,
		DialTimeout: cmp.Or(e.DialTimeout, config.DefaultEtcdDialTimeout),
		// A member that hangs is dropped from the client's choice once a
		// ping goes unanswered; per-call timeouts are the lock package's.
		DialKeepAliveTime:    keepAliveTime,
		DialKeepAliveTimeout: keepAliveTimeout,
		Logger:               zap.NewNop(),
	}, nil
}

// Wrap adapts cl to the etcd back end; cl stays the caller's to close.
func Wrap(cl *clientv3.Client) lock.EtcdClient { return client{cl} }

type client struct{ cl *clientv3.Client }

func (c client) Endpoints() []string { return c.cl.Endpoints() }

// leaseErr marks err for the lock package: lock.ErrEtcdLeaseNotFound, or
// lock.ErrEtcdUnavailable for a cluster that cannot answer for now.
func leaseErr(err error) error {
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return fmt.Errorf("%w (%w)", lock.ErrEtcdLeaseNotFound, err)
	case unavailable(err):
		return fmt.Errorf("%w (%w)", lock.ErrEtcdUnavailable, err)
	}
	return err
}

func unavailable(err error) bool {
	if err == nil {
		return false
	}
	for _, e := range []error{rpctypes.ErrLeaderChanged, rpctypes.ErrNoLeader, rpctypes.ErrTimeout,
		rpctypes.ErrTimeoutDueToLeaderFail, rpctypes.ErrTimeoutDueToConnectionLost, rpctypes.ErrTimeoutWaitAppliedIndex, context.DeadlineExceeded} {
		if errors.Is(err, e) {
			return true
		}
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return false
}

func (c client) Txn(ctx context.Context, t lock.EtcdTxn) (*lock.EtcdTxnResponse, error) {
	cmps := make([]clientv3.Cmp, len(t.If))
	for i, x := range t.If {
		var cm clientv3.Cmp
		switch x.Target {
		case lock.EtcdCreate:
			cm = clientv3.Compare(clientv3.CreateRevision(x.Key), x.Result, x.Rev)
		case lock.EtcdMod:
			cm = clientv3.Compare(clientv3.ModRevision(x.Key), x.Result, x.Rev)
		case lock.EtcdValue:
			cm = clientv3.Compare(clientv3.Value(x.Key), x.Result, x.Value)
		}
		if x.Prefix {
			cm = cm.WithPrefix()
		}
		cmps[i] = cm
	}
	resp, err := c.cl.Txn(ctx).If(cmps...).Then(ops(t.Then)...).Else(ops(t.Else)...).Commit()
	if err != nil {
		return nil, leaseErr(err)
	}
	out := &lock.EtcdTxnResponse{Succeeded: resp.Succeeded, Revision: resp.Header.Revision, Responses: make([]*lock.EtcdRange, len(resp.Responses))}
	for i, r := range resp.Responses {
		if rr := r.GetResponseRange(); rr != nil {
			out.Responses[i] = &lock.EtcdRange{Kvs: kvs(rr.Kvs), Count: rr.Count}
		}
	}
	return out, nil
}

func ops(in []lock.EtcdOp) []clientv3.Op {
	out := make([]clientv3.Op, len(in))
	for i, o := range in {
		switch o.Kind {
		case lock.EtcdGet:
			var opts []clientv3.OpOption
			if o.Prefix {
				opts = append(opts, clientv3.WithPrefix())
			}
			if o.CountOnly {
				opts = append(opts, clientv3.WithCountOnly())
			}
			out[i] = clientv3.OpGet(o.Key, opts...)
		case lock.EtcdPut:
			var opts []clientv3.OpOption
			if o.Lease != 0 {
				opts = append(opts, clientv3.WithLease(clientv3.LeaseID(o.Lease)))
			}
			out[i] = clientv3.OpPut(o.Key, o.Value, opts...)
		case lock.EtcdDelete:
			out[i] = clientv3.OpDelete(o.Key)
		}
	}
	return out
}

func kv(k *mvccpb.KeyValue) *lock.EtcdKV {
	return &lock.EtcdKV{Key: k.Key, Value: k.Value, CreateRevision: k.CreateRevision, ModRevision: k.ModRevision, Lease: k.Lease}
}

func kvs(in []*mvccpb.KeyValue) []*lock.EtcdKV {
	out := make([]*lock.EtcdKV, len(in))
	for i, k := range in {
		out[i] = kv(k)
	}
	return out
}

func (c client) Grant(ctx context.Context, ttl int64) (int64, int64, error) {
	resp, err := c.cl.Grant(ctx, ttl)
	if err != nil {
		return 0, 0, leaseErr(err)
	}
	return int64(resp.ID), resp.TTL, nil
}

func (c client) KeepAliveOnce(ctx context.Context, id int64) error {
	_, err := c.cl.KeepAliveOnce(ctx, clientv3.LeaseID(id))
	return leaseErr(err)
}

func (c client) TimeToLive(ctx context.Context, id int64) (int64, error) {
	resp, err := c.cl.TimeToLive(ctx, clientv3.LeaseID(id))
	if err != nil {
		return 0, err
	}
	return resp.TTL, nil
}

func (c client) RequestProgress(ctx context.Context) error { return c.cl.RequestProgress(ctx) }

// Watch: the client shares one gRPC stream among the watches of equal
// metadata, so a new stream value is a new stream, and a new pick of member.
func (c client) Watch(ctx context.Context, prefix string, rev int64, stream string) <-chan lock.EtcdWatchResponse {
	if stream != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "lockstep-watch", stream)
	}
	ctx = clientv3.WithRequireLeader(ctx)
	src := c.cl.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev))
	out := make(chan lock.EtcdWatchResponse)
	go func() {
		defer close(out)
		for resp := range src {
			r := lock.EtcdWatchResponse{Revision: resp.Header.Revision, CompactRevision: resp.CompactRevision, Err: resp.Err()}
			for _, ev := range resp.Events {
				r.Events = append(r.Events, lock.EtcdEvent{Delete: ev.Type == mvccpb.DELETE, Kv: kv(ev.Kv)})
			}
			select {
			case out <- r:
			case <-ctx.Done():
				for range src { // the client closes src once ctx ended
				}
				return
			}
		}
	}()
	return out
}
