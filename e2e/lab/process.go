package lab

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// process is one lab component (etcd, kube-apiserver, ...) with its output in a log file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
}

// startProcess starts bin with args, writing its output to <dir>/<name>.log. The process is
// killed when this (test) process dies, so no lab component outlives its test.
func startProcess(dir, name, bin string, args ...string) (*process, error) {
	return startCommand(dir, name, exec.Command(bin, args...))
}

// startCommand starts cmd as startProcess starts a binary, logging to <dir>/<name>.log.
func startCommand(dir, name string, cmd *exec.Cmd) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// stop terminates the process, politely first.
func (p *process) stop() {
	if p == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// waitReady polls ready until it succeeds, the process exits or ctx ends; the error then
// carries the end of the process's log.
func (p *process) waitReady(ctx context.Context, ready func(context.Context) error) error {
	var last error
	for {
		if last = ready(ctx); last == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited (%v) before it was ready; log tail:\n%s", p.name, p.err, p.logTail()) //nolint:errorlint // p.err is nil after a clean exit: %w would print %!w(<nil>)
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w; log tail:\n%s", p.name, last, p.logTail())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (p *process) logTail() string {
	data, _ := os.ReadFile(p.logPath)
	if len(data) > 4000 {
		data = data[len(data)-4000:]
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			data = data[i+1:]
		}
	}
	return string(data)
}

func hostPort(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

// ProcessUsage is what /proc says of a process: resident memory (all of it, its anonymous
// part: heap and stacks, not the binary's mapped pages; its peak) in MiB, and CPU seconds
// (user and system).
type ProcessUsage struct {
	RSSMiB, AnonRSSMiB, PeakRSSMiB, CPUSeconds float64
}

// ReadProcessUsage reads the usage of process pid from /proc.
func ReadProcessUsage(pid int) (ProcessUsage, error) {
	var u ProcessUsage
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			u.RSSMiB = kb / 1024
		case "RssAnon:":
			u.AnonRSSMiB = kb / 1024
		case "VmHWM:":
			u.PeakRSSMiB = kb / 1024
		}
	}
	st, err := readStat(pid)
	u.CPUSeconds = st.cpuSeconds
	return u, err
}

// procStat is what /proc/<pid>/stat says of a process: its command, parent and CPU seconds.
type procStat struct {
	command    string
	parent     int
	cpuSeconds float64
}

func readStat(pid int) (procStat, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	// The command is in parentheses and may hold spaces. After it: the parent is the 2nd
	// field, utime and stime the 12th and 13th, in clock ticks (USER_HZ, 100 on Linux).
	open, end := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
	if open < 0 || end < open {
		return procStat{}, fmt.Errorf("/proc/%d/stat: no command", pid)
	}
	f := strings.Fields(string(stat[end+1:]))
	if len(f) < 13 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	parent, _ := strconv.Atoi(f[1])
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return procStat{command: string(stat[open+1 : end]), parent: parent, cpuSeconds: (utime + stime) / 100}, nil
}

// CPUByCommand is the CPU seconds used so far by this process and every process it started
// (children and theirs), by command name (/proc/<pid>/comm); the processes of pids are
// counted under the names given there instead (to tell one apiserver from the others). A
// process that ended is not counted: compare two readings of processes that run throughout.
func CPUByCommand(pids map[int]string) (map[string]float64, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	parent := map[int]int{}
	name := map[int]string{}
	cpu := map[int]float64{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(pid)
		if err != nil {
			continue // ended meanwhile
		}
		parent[pid], name[pid], cpu[pid] = st.parent, st.command, st.cpuSeconds
	}
	self := os.Getpid()
	descends := func(pid int) bool {
		for i := 0; pid > 1 && i < 64; i++ {
			if pid == self {
				return true
			}
			pid = parent[pid]
		}
		return false
	}
	out := map[string]float64{}
	for pid, seconds := range cpu {
		if !descends(pid) {
			continue
		}
		n := name[pid]
		if given, ok := pids[pid]; ok {
			n = given
		}
		out[n] += seconds
	}
	return out, nil
}
