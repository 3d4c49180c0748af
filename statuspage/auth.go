package statuspage

import (
	"net/http"
	"strings"
)

// authorized reports whether r may read the page: the page is open, or r
// carries the admin token as "Authorization: Bearer <token>" or as the
// password of HTTP Basic (the user name is ignored).
func (p *Page) authorized(r *http.Request) bool {
	if p.cfg.Open {
		return true
	}
	if p.cfg.Admin == nil {
		return false
	}
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return tok != "" && p.cfg.Admin(tok)
	}
	if _, tok, ok := r.BasicAuth(); ok {
		return tok != "" && p.cfg.Admin(tok)
	}
	return false
}
