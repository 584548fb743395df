package main

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

//go:embed ui
var uiFiles embed.FS

// defaultUIAddr is where `lockstep ui` listens without --http-addr: this
// machine only, since the page can break no lock but shows every holder.
const defaultUIAddr = "127.0.0.1:8089"

const uiAbout = `Serves one live page (refreshed every second) of the held locks, their waiters, the
live rate keys, the tenants waiting for a fair share, the schedules and their recent ticks, and the recent lock losses with their reason; each
job links to its asynq task (to asynqmon with --asynqmon). The page needs no outside
network. It reads the JSON endpoints /api/overview, /api/locks, /api/rates, /api/fair, /api/waiters?resource=R,
/api/schedules, /api/ticks?schedule=S, /api/losses and /api/tasks/ID (see docs/operations.md).`

func cmdUI(ctx context.Context, a *app, args []string) int {
	fs := a.flags("ui", "ui [--http-addr ADDR] [--asynqmon URL] [--hide-payloads]", uiAbout)
	addr := fs.String("http-addr", defaultUIAddr, "address to listen on, host:port")
	asynqmon := fs.String("asynqmon", "", "base URL of an asynqmon, e.g. http://localhost:8080, to link tasks to")
	hidePayloads := fs.Bool("hide-payloads", false, "leave task payloads out of /api/tasks/ID (payload_hidden: true)")
	if _, code, done := parseN(a, fs, args, 0, ""); done {
		return code
	}
	if _, _, err := net.SplitHostPort(*addr); err != nil {
		return usageError(a, fs, "--http-addr %q: %v", *addr, err)
	}
	if *asynqmon != "" {
		if u, err := url.Parse(*asynqmon); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return usageError(a, fs, "--asynqmon %q: want an http(s) URL", *asynqmon)
		}
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(a.stderr, "lockstep ui:", err)
		return exitUsage
	}
	fmt.Fprintf(a.stdout, "lockstep ui: serving http://%s/\n", ln.Addr())
	if err := serveUI(ctx, ln, newUI(a, *asynqmon, *hidePayloads)); err != nil {
		fmt.Fprintln(a.stderr, "lockstep ui:", err)
		return exitUsage
	}
	return exitOK
}

// serveUI serves h on ln until ctx ends.
func serveUI(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-errc
	return nil
}

// ui is the page and its JSON endpoints.
type ui struct {
	a            *app
	asynqmon     string // base URL, "" for none
	hidePayloads bool   // --hide-payloads: a task's payload may hold what the page's viewers must not see
}

// newUI returns the page's handler; see "The page and its API" in docs/operations.md.
func newUI(a *app, asynqmon string, hidePayloads bool) http.Handler {
	u := &ui{a: a, asynqmon: strings.TrimSuffix(asynqmon, "/"), hidePayloads: hidePayloads}
	static, _ := fs.Sub(uiFiles, "ui")
	mux := http.NewServeMux()
	mux.Handle("GET /", http.FileServerFS(static))
	mux.HandleFunc("GET /api/overview", u.overview)
	mux.HandleFunc("GET /api/locks", u.locks)
	mux.HandleFunc("GET /api/rates", u.rates)
	mux.HandleFunc("GET /api/fair", u.fair)
	mux.HandleFunc("GET /api/waiters", u.waiters)
	mux.HandleFunc("GET /api/schedules", u.schedules)
	mux.HandleFunc("GET /api/ticks", u.ticks)
	mux.HandleFunc("GET /api/losses", u.losses)
	mux.HandleFunc("GET /api/tasks/{id}", u.task)
	mux.HandleFunc("GET /tasks/{id}", u.taskLink)
	return mux
}

// apiError is the body of every error answer.
type apiError struct {
	Error string `json:"error"`
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func replyErr(w http.ResponseWriter, status int, err error) {
	reply(w, status, apiError{Error: err.Error()})
}

// replyOr replies v, or err with errStatus when err is set.
func replyOr(w http.ResponseWriter, v any, err error, errStatus int) {
	if err != nil {
		replyErr(w, errStatus, err)
		return
	}
	reply(w, http.StatusOK, v)
}

// required returns the query parameter name, or answers 400 and false when
// the request has none.
func required(w http.ResponseWriter, r *http.Request, name string) (string, bool) {
	v := r.URL.Query().Get(name)
	if v == "" {
		replyErr(w, http.StatusBadRequest, fmt.Errorf("query parameter %s is required", name))
	}
	return v, v != ""
}

func (u *ui) locks(w http.ResponseWriter, r *http.Request) {
	ls, err := listLocks(r.Context(), u.a)
	replyOr(w, ls, err, http.StatusBadGateway)
}

func (u *ui) rates(w http.ResponseWriter, r *http.Request) {
	rs, err := listRates(r.Context(), u.a)
	replyOr(w, rs, err, http.StatusBadGateway)
}

func (u *ui) fair(w http.ResponseWriter, r *http.Request) {
	fs, err := listFair(r.Context(), u.a)
	replyOr(w, fs, err, http.StatusBadGateway)
}

func (u *ui) waiters(w http.ResponseWriter, r *http.Request) {
	res, ok := required(w, r, "resource")
	if !ok {
		return
	}
	ws, err := listWaiters(r.Context(), u.a, res)
	replyOr(w, ws, err, http.StatusBadGateway)
}

// subJSON runs a subcommand with --json and returns what it printed: the
// schedules and ticks views are those subcommands' output, as they are.
func (u *ui) subJSON(ctx context.Context, cmd subcommand, args ...string) (json.RawMessage, error) {
	var out, errb bytes.Buffer
	sub := *u.a
	sub.stdout, sub.stderr, sub.stdin = &out, &errb, strings.NewReader("")
	code := cmd(ctx, &sub, append(args, "--json"))
	if code == exitOK || code == exitNotFound {
		if raw := bytes.TrimSpace(out.Bytes()); json.Valid(raw) {
			return raw, nil
		}
		if code == exitNotFound && out.Len() == 0 {
			return json.RawMessage("[]"), nil
		}
	}
	return nil, errors.New(strings.TrimSpace(firstNonEmpty(errb.String(), out.String(), fmt.Sprintf("exit %d", code))))
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if strings.TrimSpace(s) != "" {
			return s
		}
	}
	return ""
}

func (u *ui) schedules(w http.ResponseWriter, r *http.Request) {
	raw, err := u.subJSON(r.Context(), cmdSchedules)
	replyOr(w, raw, err, http.StatusServiceUnavailable)
}

func (u *ui) ticks(w http.ResponseWriter, r *http.Request) {
	name, ok := required(w, r, "schedule")
	if !ok {
		return
	}
	raw, err := u.subJSON(r.Context(), cmdTicks, name, "--last", lastParam(r, 10))
	replyOr(w, raw, err, http.StatusServiceUnavailable)
}

func lastParam(r *http.Request, def int) string {
	if n, err := strconv.Atoi(r.URL.Query().Get("last")); err == nil && n > 0 && n <= 1000 {
		return strconv.Itoa(n)
	}
	return strconv.Itoa(def)
}

// lossView is one lost lock from internal/jobs' losses stream.
type lossView struct {
	AtMs     int64  `json:"at_ms"`
	Resource string `json:"resource"`
	Reason   string `json:"reason"` // stolen, expired, unreachable, max_hold, quorum_lost
	Fence    int64  `json:"fence"`
	Holder   string `json:"holder"`
	TaskID   string `json:"task_id"`
	Type     string `json:"type"`
	Queue    string `json:"queue"`
}

// listLosses returns the last n lock losses, newest first.
func listLosses(ctx context.Context, a *app, n int64) ([]lossView, error) {
	msgs, err := a.client.XRevRangeN(ctx, a.locker.LossesKey(), "+", "-", n).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("redis: %w", err)
	}
	out := make([]lossView, 0, len(msgs))
	for _, m := range msgs {
		s := func(k string) string { v, _ := m.Values[k].(string); return v }
		i := func(k string) int64 { v, _ := strconv.ParseInt(s(k), 10, 64); return v }
		out = append(out, lossView{AtMs: i("at_ms"), Resource: s("resource"), Reason: s("reason"), Fence: i("fence"),
			Holder: s("holder"), TaskID: s("task_id"), Type: s("type"), Queue: s("queue")})
	}
	return out, nil
}

func (u *ui) losses(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.ParseInt(lastParam(r, 20), 10, 64)
	ls, err := listLosses(r.Context(), u.a, n)
	replyOr(w, ls, err, http.StatusBadGateway)
}

// taskView is an asynq task, as /api/tasks/ID shows it.
type taskView struct {
	ID            string `json:"id"`
	Queue         string `json:"queue"`
	Type          string `json:"type"`
	State         string `json:"state"`
	Payload       string `json:"payload"`
	PayloadHidden bool   `json:"payload_hidden,omitempty"` // with --hide-payloads; payload is then ""
	Retried       int    `json:"retried"`
	MaxRetry      int    `json:"max_retry"`
	LastErr       string `json:"last_err"`
	NextProcessAt string `json:"next_process_at,omitempty"`
	CompletedAt   string `json:"completed_at,omitempty"`
	Asynqmon      string `json:"asynqmon,omitempty"` // the task's page in asynqmon, with --asynqmon
}

func (u *ui) findTask(id string) (*taskView, error) {
	info, err := findTask(u.a, id)
	if err != nil {
		return nil, err
	}
	v := &taskView{ID: info.ID, Queue: info.Queue, Type: info.Type, State: info.State.String(),
		Payload: string(info.Payload), Retried: info.Retried, MaxRetry: info.MaxRetry, LastErr: info.LastErr}
	if u.hidePayloads {
		v.Payload, v.PayloadHidden = "", true
	}
	if !info.NextProcessAt.IsZero() {
		v.NextProcessAt = info.NextProcessAt.UTC().Format(time.RFC3339Nano)
	}
	if !info.CompletedAt.IsZero() {
		v.CompletedAt = info.CompletedAt.UTC().Format(time.RFC3339Nano)
	}
	if u.asynqmon != "" {
		v.Asynqmon = u.asynqmon + "/queues/" + url.PathEscape(info.Queue) + "/tasks/" + url.PathEscape(info.ID)
	}
	return v, nil
}

func (u *ui) task(w http.ResponseWriter, r *http.Request) {
	v, err := u.findTask(r.PathValue("id"))
	switch {
	case errors.Is(err, asynq.ErrTaskNotFound):
		replyErr(w, http.StatusNotFound, fmt.Errorf("no task %q in any queue", r.PathValue("id")))
	case err != nil:
		replyErr(w, http.StatusBadGateway, err)
	default:
		reply(w, http.StatusOK, v)
	}
}

// taskLink is where the page's job links go: the task's page in asynqmon
// when there is one, else its JSON.
func (u *ui) taskLink(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if u.asynqmon != "" {
		if v, err := u.findTask(id); err == nil {
			http.Redirect(w, r, v.Asynqmon, http.StatusFound)
			return
		}
	}
	http.Redirect(w, r, "/api/tasks/"+url.PathEscape(id), http.StatusFound)
}

// overview is everything the page shows, in one answer. Each part that
// fails carries its error instead of failing the whole.
type overview struct {
	ServerTimeMs   int64                      `json:"server_time_ms"`
	Locks          []lockView                 `json:"locks"`
	LocksError     string                     `json:"locks_error,omitempty"`
	Rates          []rateView                 `json:"rates"`
	RatesError     string                     `json:"rates_error,omitempty"`
	Fair           []fairView                 `json:"fair"`
	FairError      string                     `json:"fair_error,omitempty"`
	Waiters        map[string][]waiterView    `json:"waiters"` // resource -> waiters, for locks with waiters
	Schedules      json.RawMessage            `json:"schedules"`
	SchedulesError string                     `json:"schedules_error,omitempty"`
	Ticks          map[string]json.RawMessage `json:"ticks"` // schedule -> its last ticks
	TicksErrors    map[string]string          `json:"ticks_errors,omitempty"`
	Losses         []lossView                 `json:"losses"`
	LossesError    string                     `json:"losses_error,omitempty"`
	Asynqmon       string                     `json:"asynqmon,omitempty"`
}

func (u *ui) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	o := overview{Waiters: map[string][]waiterView{}, Ticks: map[string]json.RawMessage{}, Asynqmon: u.asynqmon,
		Schedules: json.RawMessage("[]"), Locks: []lockView{}, Rates: []rateView{}, Fair: []fairView{}, Losses: []lossView{}}
	if now, err := serverTime(ctx, u.a.client); err == nil {
		o.ServerTimeMs = now.UnixMilli()
	}
	if ls, err := listLocks(ctx, u.a); err != nil {
		o.LocksError = err.Error()
	} else {
		o.Locks = ls
	}
	if rs, err := listRates(ctx, u.a); err != nil {
		o.RatesError = err.Error()
	} else {
		o.Rates = rs
	}
	if fs, err := listFair(ctx, u.a); err != nil {
		o.FairError = err.Error()
	} else {
		o.Fair = fs
	}
	for _, l := range o.Locks {
		if l.Waiters > 0 {
			if ws, err := listWaiters(ctx, u.a, l.Resource); err == nil {
				o.Waiters[l.Resource] = ws
			}
		}
	}
	if raw, err := u.subJSON(ctx, cmdSchedules); err != nil {
		o.SchedulesError = err.Error()
	} else {
		o.Schedules = raw
		var names []struct {
			Name string `json:"name"`
		}
		_ = json.Unmarshal(raw, &names)
		for _, s := range names {
			if t, err := u.subJSON(ctx, cmdTicks, s.Name, "--last", "5"); err != nil {
				if o.TicksErrors == nil {
					o.TicksErrors = map[string]string{}
				}
				o.TicksErrors[s.Name] = err.Error()
			} else {
				o.Ticks[s.Name] = t
			}
		}
	}
	if ls, err := listLosses(ctx, u.a, 20); err != nil {
		o.LossesError = err.Error()
	} else {
		o.Losses = ls
	}
	reply(w, http.StatusOK, o)
}
