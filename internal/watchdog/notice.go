package watchdog

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/lockstep-dev/lockstep/internal/backoff"
)

// A Notifier tells the watchdog, as soon as the server knows, that held keys
// may have changed: deleted, overwritten, expired or renewed. A notice never
// ends a hold by itself; it makes the watchdog renew that lease at once, and
// the renewal's answer (the authority) decides.
type Notifier interface {
	// Run delivers notices until ctx ends. keys are full Redis keys that
	// changed; all is true when notices may have been missed (a reconnect, a
	// flush) and every held lease should be checked. Run returns when ctx
	// ends, or at once when the server cannot send notices (then the
	// watchdog relies on renewals alone).
	Run(ctx context.Context, notify func(keys []string, all bool))
}

// invalidateChannel is where Redis sends tracking invalidations to a RESP2
// connection that redirected them to itself.
const invalidateChannel = "__redis__:invalidate"

// Tracking returns a Notifier that uses Redis server-assisted client-side
// caching in broadcasting mode: one connection per master node enables
// CLIENT TRACKING ON BCAST PREFIX <prefix> REDIRECT <itself> and subscribes to
// __redis__:invalidate, so the server pushes the name of every key under the
// prefix that any client modifies, and every key that expires or is evicted.
//
// It needs no CONFIG SET (unlike keyspace notifications), so it works on
// managed Redis services that allow CLIENT TRACKING (Redis 6+). A server that
// refuses it (an embedded miniredis, an old Redis) is logged once and leaves
// renewals as the only way a loss is found. Single servers, Sentinel-managed
// masters (the connection follows the master) and Cluster masters work alike.
//
// Pushes are not commands: with no key changing, the cost is one idle
// connection per master and a health-check PING every few seconds.
func Tracking(client redis.UniversalClient, prefix string, log *slog.Logger) Notifier {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &tracking{client: client, prefix: prefix, log: log}
}

type tracking struct {
	client redis.UniversalClient
	prefix string
	log    *slog.Logger
}

// nodeRescan is how often a Cluster's masters are listed again, so that a
// master added or promoted by a failover gets its tracking connection.
const nodeRescan = 10 * time.Second

func (t *tracking) Run(ctx context.Context, notify func(keys []string, all bool)) {
	cc, ok := t.client.(*redis.ClusterClient)
	if !ok {
		c, ok := t.client.(*redis.Client)
		if !ok {
			t.log.Info("watchdog: lock-loss notices off: unsupported client type; renewals alone find losses")
			return
		}
		t.node(ctx, c.Options(), notify)
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	var mu sync.Mutex // ForEachMaster calls back concurrently
	running := map[string]bool{}
	ticker := time.NewTicker(nodeRescan)
	defer ticker.Stop()
	for {
		_ = cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
			opts := c.Options()
			mu.Lock()
			defer mu.Unlock()
			if !running[opts.Addr] {
				running[opts.Addr] = true
				wg.Go(func() { t.node(ctx, opts, notify) })
			}
			return nil
		})
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// errRefused marks a server that answered CLIENT TRACKING with an error.
var errRefused = errors.New("server refused CLIENT TRACKING")

// node keeps one tracking connection to the server base dials, until ctx ends.
func (t *tracking) node(ctx context.Context, base *redis.Options, notify func([]string, bool)) {
	opts := *base
	opts.Protocol = 2 // invalidations as pub/sub messages on the redirect connection
	opts.PoolSize = 1
	opts.MaxIdleConns, opts.MinIdleConns = 0, 0
	opts.ClientSideCache, opts.ClientSideCacheConfig = nil, nil
	// The base client updates its own config at run time; this one never
	// shares it (and RESP2 has no maintenance notifications anyway).
	opts.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	userHook := base.OnConnect
	opts.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		if userHook != nil {
			if err := userHook(ctx, cn); err != nil {
				return err
			}
		}
		id, err := cn.ClientID(ctx).Result()
		if err != nil {
			return err
		}
		err = cn.Do(ctx, "CLIENT", "TRACKING", "ON", "REDIRECT", id, "BCAST", "PREFIX", t.prefix).Err()
		var rerr redis.Error
		if errors.As(err, &rerr) {
			return errors.Join(errRefused, err)
		}
		return err
	}
	c := redis.NewClient(&opts)
	defer c.Close()

	// Probe once: a server that refuses tracking would make the subscription
	// retry for ever. Transport errors are retried: Redis may be down now.
	for delay := time.Duration(0); ; {
		cn := c.Conn()
		err := cn.Ping(ctx).Err()
		_ = cn.Close()
		if err == nil {
			break
		}
		if errors.Is(err, errRefused) {
			t.log.Info("watchdog: lock-loss notices off: the server refused CLIENT TRACKING; renewals alone find losses",
				"addr", opts.Addr, "error", err)
			return
		}
		delay = backoff.Reconnect.Next(delay)
		if !backoff.Sleep(ctx, delay) {
			return
		}
	}

	ps := c.Subscribe(ctx, invalidateChannel)
	defer ps.Close()
	ch := ps.ChannelWithSubscriptions(redis.WithChannelHealthCheckInterval(2*time.Second), redis.WithChannelSendTimeout(time.Minute))
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-ch:
			switch m := m.(type) {
			case *redis.Subscription:
				// (Re)subscribed: whatever changed while the connection was
				// down went unannounced.
				notify(nil, true)
			case *redis.Message:
				if len(m.PayloadSlice) == 0 {
					notify(nil, true) // a flush: every key is gone
				} else {
					notify(m.PayloadSlice, false)
				}
			}
		}
	}
}
