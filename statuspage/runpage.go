package statuspage

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/policyd/policyd/policy"
)

// RunCallsPage is the number of calls one page of a run's dead-letter
// list shows.
const RunCallsPage = 100

// deadLetterFilter selects the calls of a run's dead-letter list: every
// final disposition but SUCCEEDED.
var deadLetterFilter = policy.RunCallFilter{Dispositions: []policy.Disposition{
	policy.DispositionDeadLetter, policy.DispositionCircuitOpen, policy.DispositionDeadlineCut, policy.DispositionFailedTerminal,
}}

// RunPage is what /status/runs/{id} shows and /status/runs/{id}.json
// serves: a run, its ledger, and one page of its dead-letter list.
type RunPage struct {
	Time time.Time `json:"time"`
	Run  Run       `json:"run"`
	// Calls are the run's dead-lettered, circuit-open, deadline-cut and
	// failed-terminal calls, by call id, after the cursor After.
	Calls []RunCall `json:"calls"`
	After string    `json:"after,omitempty"`
	// Next is the cursor of the next page (its "after"); "" on the last.
	Next string `json:"next,omitempty"`
	// Untracked counts the run's calls beyond its call table's cap: in
	// the ledger, not in the list.
	Untracked uint64 `json:"untracked"`
}

// RunCall is one call of a run's dead-letter list.
type RunCall struct {
	CallID      string `json:"call_id"`
	Disposition string `json:"disposition"`
	Stop        string `json:"stop_reason"`
	Attempts    uint32 `json:"attempts"`
	// Classification is the last failure's (e.g. transient:503), Detail
	// the decision's explanation.
	Classification string    `json:"last_classification,omitempty"`
	Detail         string    `json:"detail,omitempty"`
	Target         string    `json:"target,omitempty"`
	TriageRef      string    `json:"triage_ref,omitempty"`
	First          time.Time `json:"first_attempt_time,omitzero"`
	Last           time.Time `json:"last_attempt_time,omitzero"`
}

var runTmpl = template.Must(template.New("run.html.tmpl").Funcs(funcs).ParseFS(assets, "assets/run.html.tmpl"))

// serveRun serves /status/runs/{id}: the HTML page, or, when the path's
// last segment ends in a literal ".json" (not an escaped "%2Ejson", which
// is how a run id ending in .json is linked), the JSON document. The
// query's "after" is the cursor of the page.
func (p *Page) serveRun(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	asJSON := strings.HasSuffix(r.URL.EscapedPath(), ".json")
	if asJSON {
		id = strings.TrimSuffix(id, ".json")
	}
	rp, status, err := p.runPage(id, r.URL.Query().Get("after"))
	if err != nil {
		if status == http.StatusInternalServerError {
			p.cfg.Logger.Error("status page: run", "run", id, "err", err)
		}
		http.Error(w, "status page: "+err.Error(), status)
		return
	}
	if asJSON {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rp)
		return
	}
	var buf bytes.Buffer
	if err := runTmpl.Execute(&buf, rp); err != nil {
		p.cfg.Logger.Error("status page: rendering a run", "err", err)
		http.Error(w, "status page: rendering failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(buf.Bytes())
}

// runPage reads run id and the page of its dead-letter list after the
// call id after; an error comes with the HTTP status to answer.
func (p *Page) runPage(id, after string) (RunPage, int, error) {
	run, err := p.cfg.Source.Run(id)
	if notFound(err) {
		return RunPage{}, http.StatusNotFound, fmt.Errorf("run %q not found", id)
	}
	if err != nil {
		return RunPage{}, http.StatusInternalServerError, fmt.Errorf("reading run %q failed", id)
	}
	calls, untracked, err := p.cfg.Source.RunCalls(id, deadLetterFilter, after, RunCallsPage+1)
	if err != nil {
		return RunPage{}, http.StatusInternalServerError, fmt.Errorf("reading the calls of run %q failed", id)
	}
	rp := RunPage{Time: p.cfg.Clock.Now(), Run: runOf(&run), Calls: []RunCall{}, After: after, Untracked: untracked}
	if len(calls) > RunCallsPage {
		calls = calls[:RunCallsPage]
		rp.Next = calls[len(calls)-1].CallID
	}
	for _, c := range calls {
		rp.Calls = append(rp.Calls, RunCall{CallID: c.CallID, Disposition: c.Disposition.String(), Stop: c.Stop.String(),
			Attempts: c.Attempts, Classification: c.Classification, Detail: c.Detail, Target: c.Target, TriageRef: c.TriageRef,
			First: c.First, Last: c.Last})
	}
	return rp, 0, nil
}

// runPath is the path segment of run id's page, relative to /status/runs/:
// id escaped, a final ".json" of the id escaped as "%2Ejson" so the
// segment does not ask for JSON.
func runPath(id string) string {
	seg := url.PathEscape(id)
	if strings.HasSuffix(seg, ".json") {
		seg = strings.TrimSuffix(seg, ".json") + "%2Ejson"
	}
	return seg
}
