package lab

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"
)

// Shared is one lab for a whole test binary: starting one takes seconds, and tests share it
// by working in namespaces of their own. Declare one per package, call Main from TestMain
// and Get from each test.
type Shared struct {
	// Options start the lab; Dir is ignored (Shared makes one).
	Options Options
	// DirPrefix names the lab's temporary directory.
	DirPrefix string

	once sync.Once
	lab  *Lab
	dir  string
	err  error
}

// Get returns the lab, starting it on first use. It skips the test outside the lab's network
// namespace, or fails it under CI (see RequireLab).
func (s *Shared) Get(t testing.TB) *Lab {
	t.Helper()
	RequireLab(t)
	s.once.Do(func() {
		if s.dir, s.err = os.MkdirTemp("", s.DirPrefix+"-"); s.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		opts := s.Options
		opts.Dir = s.dir
		s.lab, s.err = Start(ctx, opts)
	})
	if s.err != nil {
		t.Fatalf("starting the lab: %v", s.err)
	}
	return s.lab
}

// Main runs the test binary's tests, then stops the lab. Its directory (the control planes'
// and managers' logs) is removed after a successful run and kept, with its path printed,
// after a failed one.
func (s *Shared) Main(m *testing.M) {
	code := m.Run()
	if s.lab != nil {
		s.lab.Stop()
	}
	if s.dir != "" {
		if code == 0 {
			_ = os.RemoveAll(s.dir)
		} else {
			fmt.Fprintf(os.Stderr, "lab logs kept in %s\n", s.dir)
		}
	}
	os.Exit(code)
}
