package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/policyd/policyd/breakerstore"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/server"
)

// A policy file (--config) declares tenant budgets and policies, in YAML or
// JSON (JSON is YAML). Budgets and policies take the API's JSON form, with
// either the proto field names or their lowerCamel forms:
//
//	tenants:
//	  - tenant: acme
//	    capacity: 100
//	    deposit_ratio: 0.1
//	policies:
//	  - tenant: acme            # optional: every tenant when absent
//	    target: geocoder        # optional: every target when absent
//	    policy:
//	      max_attempts: 5
//	      backoff: {base_delay: 1s, factor: 2, max_delay: 20s, jitter: JITTER_EQUAL}
//	      breaker: {consecutive_failures: 10, cooldown: 30s}
//
// The file is loaded at start, again on SIGHUP and whenever it changes on
// disk (its directory is watched, so a ConfigMap's symlink swap counts), all
// or nothing: every
// entry is validated before any is written, and a file with an error changes
// nothing and says which line and why. Entries that a later version of the
// file no longer declares are deleted; entries set through the admin API
// and never declared in the file are left alone.

// configFile is a parsed, validated policy file.
type configFile struct {
	budgets  []policy.TenantBudget
	policies []scopedPolicy
}

type scopedPolicy struct {
	tenant, target string
	policy         policy.Policy
}

// parseConfig reads and validates a policy file; check validates each
// budget as the store will. Errors are "file:line: field: rule".
func parseConfig(path string, raw []byte, check func(policy.TenantBudget) error) (*configFile, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(raw, &root); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	cf := &configFile{}
	if len(root.Content) == 0 {
		return cf, nil
	}
	doc := root.Content[0]
	if doc.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s:%d: the file must be a mapping with tenants and policies", path, doc.Line)
	}
	seenBudget := map[string]int{}
	seenPolicy := map[[2]string]int{}
	for i := 0; i+1 < len(doc.Content); i += 2 {
		key, val := doc.Content[i], doc.Content[i+1]
		if val.Kind != yaml.SequenceNode {
			return nil, fmt.Errorf("%s:%d: %s: must be a list", path, val.Line, key.Value)
		}
		switch key.Value {
		case "tenants":
			for n, item := range val.Content {
				field := fmt.Sprintf("tenants[%d]", n)
				b := &pb.TenantBudget{}
				if err := decodeNode(item, b); err != nil {
					return nil, fmt.Errorf("%s:%d: %s: %v", path, item.Line, field, err)
				}
				d, err := server.BudgetFromProto(field, b)
				if err != nil {
					return nil, fmt.Errorf("%s:%d: %v", path, item.Line, err)
				}
				if err := check(d); err != nil {
					return nil, fmt.Errorf("%s:%d: %s: %v", path, item.Line, field, err)
				}
				if line, dup := seenBudget[d.Tenant]; dup {
					return nil, fmt.Errorf("%s:%d: %s: tenant %q is already declared on line %d", path, item.Line, field, d.Tenant, line)
				}
				seenBudget[d.Tenant] = item.Line
				cf.budgets = append(cf.budgets, d)
			}
		case "policies":
			for n, item := range val.Content {
				field := fmt.Sprintf("policies[%d]", n)
				var entry struct {
					Tenant string          `json:"tenant"`
					Target string          `json:"target"`
					Policy json.RawMessage `json:"policy"`
				}
				if err := decodeNode(item, &entry); err != nil {
					return nil, fmt.Errorf("%s:%d: %s: %v", path, item.Line, field, err)
				}
				if err := server.CheckScope(entry.Tenant, entry.Target); err != nil {
					return nil, fmt.Errorf("%s:%d: %s.%v", path, item.Line, field, err)
				}
				if len(entry.Policy) == 0 {
					return nil, fmt.Errorf("%s:%d: %s.policy: is required", path, item.Line, field)
				}
				p := &pb.Policy{}
				if err := protojson.Unmarshal(entry.Policy, p); err != nil {
					return nil, fmt.Errorf("%s:%d: %s.policy: %v", path, item.Line, field, err)
				}
				dp, err := server.PolicyFromProto(field+".policy", p)
				if err == nil {
					err = server.CheckOwnTarget(field+".policy", entry.Target, &dp)
				}
				if err != nil {
					return nil, fmt.Errorf("%s:%d: %v", path, item.Line, err)
				}
				scope := [2]string{entry.Tenant, entry.Target}
				if line, dup := seenPolicy[scope]; dup {
					return nil, fmt.Errorf("%s:%d: %s: scope %q/%q is already declared on line %d", path, item.Line, field, entry.Tenant, entry.Target, line)
				}
				seenPolicy[scope] = item.Line
				cf.policies = append(cf.policies, scopedPolicy{entry.Tenant, entry.Target, dp})
			}
		default:
			return nil, fmt.Errorf("%s:%d: unknown key %q (want tenants or policies)", path, key.Line, key.Value)
		}
	}
	return cf, nil
}

// decodeNode decodes a YAML node into a proto message (through protojson)
// or a Go value (through encoding/json, refusing unknown keys).
func decodeNode(n *yaml.Node, into any) error {
	var v any
	if err := n.Decode(&v); err != nil {
		return err
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if m, ok := into.(proto.Message); ok {
		return protojson.Unmarshal(raw, m)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(into)
}

// configLoader applies a policy file to the store and remembers what it
// declared, so a reload can delete what the file dropped.
type configLoader struct {
	path  string
	store *breakerstore.Store

	// now reads the clock for the reload metrics; nil is time.Now.
	now func() time.Time

	mu       sync.Mutex
	budgets  map[string]bool
	policies map[[2]string]bool
	lastOK   bool      // the last load was applied
	lastGood time.Time // when a load was last applied
	lastSum  [32]byte  // SHA-256 of the bytes last loaded, applied or not
}

// concernsConfig tells whether ev, in the policy file's directory, may have
// changed the file called name: an event on that name, or on the ..data
// symlink and ..<timestamp> directories of a ConfigMap volume. Events of
// other files (the state file, when it shares the directory) and mode
// changes do not.
func concernsConfig(ev fsnotify.Event, name string) bool {
	if ev.Op == fsnotify.Chmod {
		return false
	}
	base := filepath.Base(ev.Name)
	return base == name || strings.HasPrefix(base, "..")
}

// settleDelay is how long the watch waits after the last event in the
// policy file's directory before it reports a change: an editor's save or
// the kubelet's symlink swap is several events.
const settleDelay = 200 * time.Millisecond

// watch watches the policy file's directory (not the file: a Kubernetes
// ConfigMap volume replaces the file by swapping the ..data symlink, and
// editors replace it by renaming) and signals changed once the directory
// has been quiet for settleDelay after an event that concerns the file;
// reload(..., true) then
// decides from the file's bytes whether anything changed. The watch runs
// until stop is called.
func (l *configLoader) watch(log *slog.Logger) (changed <-chan struct{}, stop func(), err error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, nil, fmt.Errorf("--config: watching: %w", err)
	}
	dir, name := filepath.Split(l.path)
	if dir == "" {
		dir = "."
	}
	if err := w.Add(dir); err != nil {
		w.Close()
		return nil, nil, fmt.Errorf("--config: watching %s: %w", dir, err)
	}
	ch := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		settle := time.NewTimer(time.Hour)
		settle.Stop()
		defer settle.Stop()
		for {
			select {
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if concernsConfig(ev, name) {
					settle.Reset(settleDelay)
				}
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				log.Warn("watching the policy file's directory", "dir", dir, "err", err.Error())
			case <-settle.C:
				select {
				case ch <- struct{}{}:
				default: // one pending signal is enough
				}
			}
		}
	}()
	return ch, func() { w.Close(); <-done }, nil
}

// lastLoad reports whether the last load was applied and when one last
// was.
func (l *configLoader) lastLoad() (ok bool, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastOK, l.lastGood
}

// load reads, validates and applies the file; on any error nothing changes.
func (l *configLoader) load() (budgets, policies int, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	raw, err := os.ReadFile(l.path)
	if err != nil {
		return 0, 0, fmt.Errorf("--config: %w", err)
	}
	return l.loadRaw(raw)
}

// reload loads the file again and logs the outcome; trigger says why
// ("SIGHUP", "file changed"). With onlyIfChanged, a file whose bytes are
// those of the last load (applied or refused) is left alone: a watch sees
// several events for one save, and a refused file is not refused again
// until it changes.
func (l *configLoader) reload(log *slog.Logger, trigger string, onlyIfChanged bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	raw, err := os.ReadFile(l.path)
	if err == nil && onlyIfChanged && sha256.Sum256(raw) == l.lastSum {
		return
	}
	var nb, np int
	if err != nil {
		err = fmt.Errorf("--config: %w", err)
	} else {
		nb, np, err = l.loadRaw(raw)
	}
	if err != nil {
		// All or nothing: a bad file changes nothing.
		log.Error("config reload refused; nothing changed", "trigger", trigger, "err", err.Error())
		return
	}
	log.Info("config reloaded", "trigger", trigger, "file", l.path, "tenants", nb, "policies", np)
}

// loadRaw validates and applies raw, the file's bytes, and records the
// outcome for the metrics; l.mu must be held.
func (l *configLoader) loadRaw(raw []byte) (budgets, policies int, err error) {
	l.lastSum = sha256.Sum256(raw)
	budgets, policies, err = l.apply(raw)
	l.lastOK = err == nil
	if err == nil {
		now := time.Now
		if l.now != nil {
			now = l.now
		}
		l.lastGood = now()
	}
	return budgets, policies, err
}

// apply is loadRaw's work; l.mu must be held.
func (l *configLoader) apply(raw []byte) (budgets, policies int, err error) {
	cf, err := parseConfig(l.path, raw, l.store.CheckBudget)
	if err != nil {
		return 0, 0, err
	}
	nextB, nextP := map[string]bool{}, map[[2]string]bool{}
	for _, b := range cf.budgets {
		if _, err := l.store.SetBudget(b); err != nil {
			return 0, 0, fmt.Errorf("%s: tenant %q: %w", l.path, b.Tenant, err)
		}
		nextB[b.Tenant] = true
	}
	for _, p := range cf.policies {
		if _, err := l.store.SetPolicy(p.tenant, p.target, p.policy); err != nil {
			return 0, 0, fmt.Errorf("%s: policy %q/%q: %w", l.path, p.tenant, p.target, err)
		}
		nextP[[2]string{p.tenant, p.target}] = true
	}
	for t := range l.budgets {
		if !nextB[t] {
			if err := l.store.DeleteBudget(t); err != nil && !errors.Is(err, policy.ErrNotFound) {
				return 0, 0, err
			}
		}
	}
	for s := range l.policies {
		if !nextP[s] {
			if err := l.store.DeletePolicy(s[0], s[1]); err != nil && !errors.Is(err, policy.ErrNotFound) {
				return 0, 0, err
			}
		}
	}
	l.budgets, l.policies = nextB, nextP
	return len(cf.budgets), len(cf.policies), nil
}

func configCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "config", Short: "Work with policy files (--config)"}
	check := &cobra.Command{
		Use:   "check FILE",
		Short: "Validate a policy file offline, as the daemon would load it",
		Long: `Validate a policy file without a daemon: every tenant budget and policy is
parsed and checked by the same rules policyd serve --config applies, and the
first problem is printed as file:line: field: rule. Exits non-zero on any
problem, so CI can run it on a file before it is deployed.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cf, err := checkConfigFile(args[0])
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s: ok (%d tenants, %d policies)\n", args[0], len(cf.budgets), len(cf.policies))
			return err
		},
	}
	cmd.AddCommand(check)
	return cmd
}

// checkConfigFile parses and validates the policy file at path offline.
// Budgets are checked against a throwaway store in a temporary directory,
// so their defaults are filled exactly as the daemon fills them.
func checkConfigFile(path string) (*configFile, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "policyd-config-check")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	store, err := breakerstore.Open(breakerstore.Options{Path: filepath.Join(dir, "check.db")})
	if err != nil {
		return nil, err
	}
	defer store.Close()
	return parseConfig(path, raw, store.CheckBudget)
}
