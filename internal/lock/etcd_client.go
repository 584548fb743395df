package lock

import (
	"context"
	"errors"
)

// EtcdClient is what the etcd back end asks of an etcd client: transactions,
// leases and a watch. Package internal/etcdclient implements it over
// go.etcd.io/etcd/client/v3, so that this package, and every program that
// locks on Redis only, links no etcd or gRPC code (the public package etcd
// and the binaries that accept lock.backend etcd link it).
//
// The types mirror etcd's own (KeyValue, Compare, Op, TxnResponse,
// WatchResponse) with only the fields the back end reads.
type EtcdClient interface {
	// Txn commits If ? Then : Else in one etcd transaction.
	Txn(ctx context.Context, t EtcdTxn) (*EtcdTxnResponse, error)
	// Grant grants a lease of ttl seconds and returns its id and the TTL
	// the server granted (it raises one below its minimum).
	Grant(ctx context.Context, ttl int64) (id, granted int64, err error)
	// KeepAliveOnce renews lease id once; an error matching
	// ErrEtcdLeaseNotFound when the server no longer has it.
	KeepAliveOnce(ctx context.Context, id int64) error
	// TimeToLive returns the seconds lease id has left.
	TimeToLive(ctx context.Context, id int64) (int64, error)
	// Watch follows every key under prefix from revision rev, requiring a
	// leader. Watches of distinct stream values go on distinct streams (a
	// new pick of member). The channel closes when ctx ends or the watch
	// fails (then the last response has Err set).
	Watch(ctx context.Context, prefix string, rev int64, stream string) <-chan EtcdWatchResponse
	// RequestProgress asks the member of ctx's watch stream for a progress
	// notice (a response without events).
	RequestProgress(ctx context.Context) error
	// Endpoints lists the members the client may reach.
	Endpoints() []string
}

// ErrEtcdLeaseNotFound is matched by an EtcdClient's error when the lease
// named is gone (expired or revoked).
var ErrEtcdLeaseNotFound = errors.New("etcdserver: requested lease not found")

// ErrEtcdUnavailable is matched by an EtcdClient's error when the cluster
// could not answer for now: a member gone or unreachable, a leader change,
// no leader, a timeout. A write's outcome is then unknown.
var ErrEtcdUnavailable = errors.New("etcd: unavailable for now")

// EtcdKV is a key as etcd stores it.
type EtcdKV struct {
	Key, Value                  []byte
	CreateRevision, ModRevision int64
	Lease                       int64 // 0: none
}

// EtcdCmpTarget is what an EtcdCmp compares.
type EtcdCmpTarget int

const (
	EtcdCreate EtcdCmpTarget = iota // the key's create revision (0: absent)
	EtcdMod                         // its mod revision
	EtcdValue                       // its value
)

// EtcdCmp compares Target of Key (of every key under Key with Prefix) with
// Rev or Value by Result ("=", "<", ">", "!=").
type EtcdCmp struct {
	Key    string
	Target EtcdCmpTarget
	Result string
	Rev    int64
	Value  string
	Prefix bool
}

// WithPrefix applies c to every key with c's key as prefix.
func (c EtcdCmp) WithPrefix() EtcdCmp { c.Prefix = true; return c }

func cmpCreate(key, result string, rev int64) EtcdCmp {
	return EtcdCmp{Key: key, Target: EtcdCreate, Result: result, Rev: rev}
}

func cmpMod(key, result string, rev int64) EtcdCmp {
	return EtcdCmp{Key: key, Target: EtcdMod, Result: result, Rev: rev}
}

func cmpValue(key, value string) EtcdCmp {
	return EtcdCmp{Key: key, Target: EtcdValue, Result: "=", Value: value}
}

// EtcdOpKind is what an EtcdOp does.
type EtcdOpKind int

const (
	EtcdGet EtcdOpKind = iota
	EtcdPut
	EtcdDelete
)

// EtcdOp is one operation of a transaction: a get (of one key, or of every
// key under Key with Prefix; CountOnly: only how many), a put bound to
// Lease (0: none), or a delete.
type EtcdOp struct {
	Kind      EtcdOpKind
	Key       string
	Value     string
	Lease     int64
	Prefix    bool
	CountOnly bool
}

func opGet(key string) EtcdOp       { return EtcdOp{Kind: EtcdGet, Key: key} }
func opGetPrefix(key string) EtcdOp { return EtcdOp{Kind: EtcdGet, Key: key, Prefix: true} }
func opCount(key string) EtcdOp     { return EtcdOp{Kind: EtcdGet, Key: key, CountOnly: true} }
func opCountPrefix(key string) EtcdOp {
	return EtcdOp{Kind: EtcdGet, Key: key, Prefix: true, CountOnly: true}
}
func opDelete(key string) EtcdOp { return EtcdOp{Kind: EtcdDelete, Key: key} }
func opPut(key, value string, lease int64) EtcdOp {
	return EtcdOp{Kind: EtcdPut, Key: key, Value: value, Lease: lease}
}

// EtcdTxn is a transaction: Then when every If holds, else Else.
type EtcdTxn struct {
	If         []EtcdCmp
	Then, Else []EtcdOp
}

// EtcdRange is a get's answer: the keys read (none with CountOnly) and how
// many there are.
type EtcdRange struct {
	Kvs   []*EtcdKV
	Count int64
}

// EtcdTxnResponse is a transaction's answer: whether If held, the store's
// revision, and one entry per operation run (a get's range; nil for a put
// or a delete).
type EtcdTxnResponse struct {
	Succeeded bool
	Revision  int64
	Responses []*EtcdRange
}

// EtcdEvent is one change of a watched key: a put, or a delete (Kv then
// has the key and the delete's mod revision).
type EtcdEvent struct {
	Delete bool
	Kv     *EtcdKV
}

// EtcdWatchResponse is one answer of a watch: events, or a progress notice
// (no events), at the store's Revision. CompactRevision is set when the
// watch's start was compacted away; Err when the watch ended.
type EtcdWatchResponse struct {
	Events          []EtcdEvent
	Revision        int64
	CompactRevision int64
	Err             error
}

// etcdTxnBuilder spells a transaction as etcd's client does:
// b.txn(ctx).If(...).Then(...).Else(...).Commit().
type etcdTxnBuilder struct {
	ctx context.Context
	cl  EtcdClient
	t   EtcdTxn
}

func (b *etcdBackend) txn(ctx context.Context) *etcdTxnBuilder {
	return &etcdTxnBuilder{ctx: ctx, cl: b.cl}
}

func (t *etcdTxnBuilder) If(c ...EtcdCmp) *etcdTxnBuilder  { t.t.If = c; return t }
func (t *etcdTxnBuilder) Then(o ...EtcdOp) *etcdTxnBuilder { t.t.Then = o; return t }
func (t *etcdTxnBuilder) Else(o ...EtcdOp) *etcdTxnBuilder { t.t.Else = o; return t }
func (t *etcdTxnBuilder) Commit() (*EtcdTxnResponse, error) {
	return t.cl.Txn(t.ctx, t.t)
}

// get reads key (with prefix, every key under it) in a one-operation
// transaction, linearizably.
func (b *etcdBackend) get(ctx context.Context, op EtcdOp) (*EtcdRange, error) {
	resp, err := b.cl.Txn(ctx, EtcdTxn{Then: []EtcdOp{op}})
	if err != nil {
		return nil, err
	}
	return resp.Responses[0], nil
}
