package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lockstep-dev/lockstep/internal/lifecycle"
)

// readyTimeout bounds all checks of one /readyz request. It is below the
// Kubernetes default probe timeout (1s), so the prober reads our reasons
// rather than timing out itself.
const readyTimeout = 800 * time.Millisecond

// Server serves, on one address:
//   - /metrics: the gatherer's metrics. It never touches Redis itself, so it
//     answers while Redis is down; a failing collector drops only its own series.
//   - /healthz: 200 "ok" while the process runs.
//   - /readyz: 200 "ok" when every check returns nil within readyTimeout,
//     else 503 and one line "name: reason" per failing check, sorted by name.
//
// Start and Stop fit an fx lifecycle hook as they are.
type Server struct {
	addr         string
	log          *slog.Logger
	checks       map[string]func(context.Context) error
	readyTimeout time.Duration
	srv          *http.Server
	notReady     atomic.Bool // last /readyz failed; to log changes only

	life   lifecycle.Machine
	mu     sync.Mutex
	ln     net.Listener  // guarded by mu, for Addr
	served chan struct{} // closed when Serve returns
}

// NewServer returns a server for addr (host:port; port 0 picks a free one).
// A nil g serves prometheus.DefaultGatherer and a nil log discards. Each
// check must return soon after its context ends; one that does not is
// reported as failed and left to finish on its own.
func NewServer(addr string, g prometheus.Gatherer, checks map[string]func(context.Context) error, log *slog.Logger) *Server {
	if g == nil {
		g = prometheus.DefaultGatherer
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{addr: addr, log: log, checks: maps.Clone(checks), readyTimeout: readyTimeout}
	errLog := slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorLog:      errLog,
		ErrorHandling: promhttp.ContinueOnError,
		// OpenMetrics when the scraper asks for it (Accept): the format that
		// carries the histograms' exemplars (trace ids).
		EnableOpenMetrics: true,
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	s.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       time.Minute,
		ErrorLog:          errLog,
	}
	return s
}

// Start listens at once, so that a bad or busy address is its error, and
// serves in a goroutine; a failed Start leaves the server stopped. Like every
// background service it follows internal/lifecycle: it returns at once, a
// repeated Start does nothing, a Start after Stop fails.
func (s *Server) Start(ctx context.Context) error {
	err := s.life.Start(func() error {
		ln, err := new(net.ListenConfig).Listen(ctx, "tcp", s.addr)
		if err != nil {
			return err
		}
		served := make(chan struct{})
		s.mu.Lock()
		s.ln, s.served = ln, served
		s.mu.Unlock()
		go func() {
			defer close(served)
			if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("metrics server stopped", "addr", ln.Addr().String(), "err", err)
			}
		}()
		s.log.Info("metrics server listening", "addr", ln.Addr().String())
		return nil
	})
	if err != nil {
		return fmt.Errorf("metrics server: %w", err)
	}
	return nil
}

// Stop closes the listener, waits for requests in flight until ctx ends (then
// drops them and returns ctx's error) and for the serving goroutine to exit.
// Like every background service it follows internal/lifecycle: it is safe
// before Start and to repeat, and a Stop that finds another under way waits
// for it, bounded by its own ctx.
func (s *Server) Stop(ctx context.Context) error {
	return s.life.Stop(ctx, func(ctx context.Context) error {
		err := s.srv.Shutdown(ctx)
		if err != nil {
			_ = s.srv.Close()
		}
		<-s.served
		return err
	})
}

// Addr is the address listened on once started (with the real port when
// asked for port 0), else the configured one.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return s.ln.Addr().String()
	}
	return s.addr
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	failures := s.failures(r.Context())
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if len(failures) == 0 {
		_, _ = io.WriteString(w, "ok\n")
		return
	}
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = io.WriteString(w, strings.Join(failures, "\n")+"\n")
}

// failures runs every check at once under one timeout and returns a line
// "name: reason" for each that failed or did not answer, sorted by name.
func (s *Server) failures(ctx context.Context) []string {
	ctx, cancel := context.WithTimeoutCause(ctx, s.readyTimeout, fmt.Errorf("no answer within %v", s.readyTimeout))
	defer cancel()
	type result struct {
		name string
		err  error
	}
	results := make(chan result, len(s.checks)) // buffered: a late check must not block
	for name, check := range s.checks {
		go func() { results <- result{name, run(ctx, check)} }()
	}
	pending := make(map[string]bool, len(s.checks))
	for name := range s.checks {
		pending[name] = true
	}
	var failures []string
	for len(pending) > 0 {
		select {
		case r := <-results:
			delete(pending, r.name)
			if r.err != nil {
				failures = append(failures, r.name+": "+oneLine(r.err.Error()))
			}
		case <-ctx.Done():
			for name := range pending {
				failures = append(failures, name+": "+context.Cause(ctx).Error())
			}
			clear(pending)
		}
	}
	slices.Sort(failures)

	if len(failures) > 0 && !s.notReady.Swap(true) {
		s.log.Warn("not ready", "failures", failures)
	} else if len(failures) == 0 && s.notReady.Swap(false) {
		s.log.Info("ready again")
	}
	return failures
}

// run calls check, turning a panic into a failure: a broken probe must not
// take the process down with it.
func run(ctx context.Context, check func(context.Context) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return check(ctx)
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
