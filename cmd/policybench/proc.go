package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat;
// 100 on every Linux build that matters.
const clockTicks = 100

// cpuTime returns the user plus system CPU time pid has used, from
// /proc/<pid>/stat (10ms resolution).
func cpuTime(pid int) (time.Duration, error) {
	self, _, err := statTimes(pid)
	return self, err
}

// cpuTimeWithChildren is cpuTime of pid and of its children: those it
// has waited for (cutime and cstime) and those alive
// (/proc/<pid>/task/<pid>/children), as the child redis-server forks to
// rewrite its AOF. Its difference over a window counts a child's CPU in
// that window, the part before the window left out.
func cpuTimeWithChildren(pid int) (time.Duration, error) {
	self, reaped, err := statTimes(pid)
	if err != nil {
		return 0, err
	}
	total := self + reaped
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return 0, err
	}
	for _, f := range strings.Fields(string(raw)) {
		child, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		if t, _, err := statTimes(child); err == nil { // a child gone since is in reaped next time
			total += t
		}
	}
	return total, nil
}

// statTimes reads the CPU times of /proc/<pid>/stat: pid's own (utime
// plus stime) and its waited-for children's (cutime plus cstime).
func statTimes(pid int) (self, reaped time.Duration, err error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The command name is in parentheses and may hold spaces: fields
	// start after the last ')'. utime, stime, cutime and cstime are
	// fields 14 to 17.
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0, 0, errors.New("unexpected /proc stat format")
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 15 {
		return 0, 0, errors.New("unexpected /proc stat format")
	}
	var n [4]uint64
	var errs [4]error
	for j := range n {
		n[j], errs[j] = strconv.ParseUint(f[11+j], 10, 64)
	}
	if err := errors.Join(errs[:]...); err != nil {
		return 0, 0, err
	}
	tick := func(t uint64) time.Duration { return time.Duration(t) * time.Second / clockTicks }
	return tick(n[0] + n[1]), tick(n[2] + n[3]), nil
}

// memStatus is what soak samples of /proc/<pid>/status, in bytes.
type memStatus struct {
	VmRSS, RssAnon, RssFile int64
	Threads                 int
}

func readMem(pid int) (memStatus, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memStatus{}, err
	}
	defer f.Close()
	var m memStatus
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(fields[0], 10, 64)
		switch k {
		case "VmRSS":
			m.VmRSS = n << 10
		case "RssAnon":
			m.RssAnon = n << 10
		case "RssFile":
			m.RssFile = n << 10
		case "Threads":
			m.Threads = int(n)
		}
	}
	return m, sc.Err()
}

// pidListening finds the process listening on the TCP address addr (a
// loopback host:port) through /proc/net/tcp and the processes' open file
// descriptors. It returns 0 when it cannot tell (another user's process,
// no /proc).
func pidListening(addr string) int {
	_, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return 0
	}
	inodes := map[string]bool{}
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		raw, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(raw), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" { // 0A: LISTEN
				continue
			}
			_, hexPort, _ := strings.Cut(f[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); err == nil && p == port {
				inodes["socket:["+f[9]+"]"] = true
			}
		}
	}
	if len(inodes) == 0 {
		return 0
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range procs {
		target, err := os.Readlink(fd)
		if err != nil || !inodes[target] {
			continue
		}
		pid, err := strconv.Atoi(strings.Split(fd, "/")[2])
		if err == nil && pid != os.Getpid() {
			return pid
		}
	}
	return 0
}

// hostCPU is the machine's CPU time so far, from the first line of
// /proc/stat, in ticks: all of it, and of it the time the hypervisor gave
// to other guests while this one had work to run (steal).
type hostCPU struct{ total, steal uint64 }

func readHostCPU() (hostCPU, error) {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return hostCPU{}, err
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	// cpu user nice system idle iowait irq softirq steal (guest time is
	// in user already).
	if len(f) < 9 || f[0] != "cpu" {
		return hostCPU{}, errors.New("unexpected /proc/stat format")
	}
	var h hostCPU
	for i, v := range f[1:9] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return hostCPU{}, err
		}
		h.total += n
		if i == 7 {
			h.steal = n
		}
	}
	return h, nil
}

// stolen is the share of the machine's CPU time from b to a that was
// stolen, -1 when unknown.
func (a hostCPU) stolen(b hostCPU) float64 {
	if a.total <= b.total {
		return -1
	}
	return float64(a.steal-b.steal) / float64(a.total-b.total)
}
