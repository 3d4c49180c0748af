package breakerstore_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/policy"
)

func TestResolve(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	set := func(tenant, target string, attempts int) {
		p := policy.Default()
		p.MaxAttempts = attempts
		must(s.SetPolicy(tenant, target, p)).get(t)
	}
	set("acme", "payments", 10)
	set("", "payments", 20)
	set("acme", "", 30)
	set("", "search", 40)

	tests := []struct {
		name         string
		tenant       string
		target       string
		wantAttempts int
		wantScope    string
	}{
		{"tenant and target", "acme", "payments", 10, "acme/payments"},
		{"target beats tenant", "globex", "payments", 20, "/payments"},
		{"tenant", "acme", "search-v2", 30, "acme/"},
		{"target only entry for another tenant", "globex", "search", 40, "/search"},
		{"target over tenant for acme", "acme", "search", 40, "/search"},
		{"built-in default", "globex", "mail", 3, "/"},
	}
	check := func(s *breakerstore.Store) {
		for _, tt := range tests {
			p, entry := s.Resolve(tt.tenant, tt.target)
			if got := entry.Tenant + "/" + entry.Target; p.MaxAttempts != tt.wantAttempts || got != tt.wantScope {
				t.Errorf("%s: got %d attempts from %q, want %d from %q", tt.name, p.MaxAttempts, got, tt.wantAttempts, tt.wantScope)
			}
		}
	}
	check(s)
	check(e.reopen(s))
}

func TestPolicyAdmin(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	_, err := s.SetPolicy("", "", policy.Default())
	wantErr(t, "SetPolicy without a scope", err, breakerstore.ErrInvalid)
	_, err = s.SetPolicy("a\x00", "x", policy.Default())
	wantErr(t, "SetPolicy with a NUL", err, breakerstore.ErrInvalid)
	_, err = s.Policy("a", "x")
	wantErr(t, "Policy of an unset scope", err, breakerstore.ErrNotFound)
	wantErr(t, "DeletePolicy of an unset scope", s.DeletePolicy("a", "x"), breakerstore.ErrNotFound)

	p := policy.Default()
	entry := must(s.SetPolicy("a", "x", p)).get(t)
	if !entry.Updated.Equal(e.clock.Now()) {
		t.Errorf("Updated: got %v, want %v", entry.Updated, e.clock.Now())
	}
	p.TransientHTTP[0] = 999 // the store keeps its own copy
	if got := must(s.Policy("a", "x")).get(t); got.Policy.TransientHTTP[0] != 429 {
		t.Errorf("stored policy changed with the caller's slice: %v", got.Policy.TransientHTTP)
	}
	for _, k := range []policy.PolicyScope{{Tenant: "b"}, {Target: "y"}, {Tenant: "a", Target: "w"}} {
		must(s.SetPolicy(k.Tenant, k.Target, policy.Default())).get(t)
	}
	tests := []struct {
		name  string
		after policy.PolicyScope
		limit int
		want  string
	}{
		{"all", policy.PolicyScope{}, 0, "[/y a/w a/x b/]"},
		{"page", policy.PolicyScope{Target: "y"}, 2, "[a/w a/x]"},
	}
	for _, tt := range tests {
		var got []string
		for _, e := range must(s.Policies(tt.after, tt.limit)).get(t) {
			got = append(got, e.Tenant+"/"+e.Target)
		}
		if fmt.Sprint(got) != tt.want {
			t.Errorf("Policies %s: got %v, want %v", tt.name, got, tt.want)
		}
	}
	if err := s.DeletePolicy("a", "x"); err != nil {
		t.Fatal(err)
	}
	s = e.reopen(s)
	if _, err := s.Policy("a", "x"); !errors.Is(err, breakerstore.ErrNotFound) {
		t.Errorf("Policy after delete and reopen: got %v, want ErrNotFound", err)
	}
}
