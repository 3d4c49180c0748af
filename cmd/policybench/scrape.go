package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// scrape reads the Prometheus text exposition at url and returns, for each
// metric name asked for, the sum of its samples over all label sets.
// A name the endpoint does not expose is absent from the map.
func scrape(ctx context.Context, url string, names ...string) (map[string]float64, error) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	err := scrapeEach(ctx, url, func(name, _ string, v float64) {
		if want[name] {
			out[name] += v
		}
	})
	return out, err
}

// scrapeBuckets reads the histogram name at url, summed over its label
// sets: how many samples fell at or under each finite bucket bound, and
// how many in all.
func scrapeBuckets(ctx context.Context, url, name string) (le map[float64]float64, count float64, err error) {
	le = map[float64]float64{}
	err = scrapeEach(ctx, url, func(n, labels string, v float64) {
		switch n {
		case name + "_count":
			count += v
		case name + "_bucket":
			_, bound, ok := strings.Cut(labels, `le="`)
			if !ok {
				return
			}
			bound, _, _ = strings.Cut(bound, `"`)
			if b, err := strconv.ParseFloat(bound, 64); err == nil && !math.IsInf(b, 1) {
				le[b] += v
			}
		}
	})
	return le, count, err
}

// scrapeEach calls fn with every sample of the exposition at url: its
// metric name, its labels ("{...}", or "") and its value.
func scrapeEach(ctx context.Context, url string, fn func(name, labels string, v float64)) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, labels := line, "", ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		if strings.HasPrefix(rest, "{") {
			if j := strings.LastIndexByte(rest, '}'); j >= 0 {
				labels, rest = rest[:j+1], rest[j+1:]
			}
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		fn(name, labels, v)
	}
	return sc.Err()
}

// metricsURL turns a --metrics value (host:port or a URL) into the URL of
// the metrics page.
func metricsURL(v string) string {
	if v == "" {
		return ""
	}
	if !strings.Contains(v, "://") {
		v = "http://" + v
	}
	if !strings.HasSuffix(v, "/metrics") {
		v = strings.TrimSuffix(v, "/") + "/metrics"
	}
	return v
}

// fetchMetrics returns the Prometheus text exposition at url.
func fetchMetrics(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", url, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// byLabel returns the samples of the metric name in the exposition text
// by the value of its label (a sample without it under ""), summed over
// its other labels.
func byLabel(text, name, label string) map[string]float64 {
	out := map[string]float64{}
	key := label + `="`
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		value := ""
		if rest[0] == '{' {
			j := strings.LastIndexByte(rest, '}')
			if j < 0 {
				continue
			}
			if _, after, found := strings.Cut(rest[:j], key); found {
				value, _, _ = strings.Cut(after, `"`)
			}
			rest = rest[j+1:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			out[value] += v
		}
	}
	return out
}

// bucketsOver is how many of a histogram's samples lie above the largest
// bucket bound at or under limit, and that bound (0 without one).
func bucketsOver(le map[float64]float64, count, limit float64) (over, bound float64) {
	for b := range le {
		if b <= limit && b > bound {
			bound = b
		}
	}
	if bound == 0 {
		return count, 0
	}
	return count - le[bound], bound
}
