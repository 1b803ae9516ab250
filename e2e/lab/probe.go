package lab

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// ServeMachineName runs, inside the worker's VM on port, an HTTP server that answers every
// request with the worker's machine name: a stand-in for a guest workload behind a NodePort
// (an ingress controller, say), which tells a client which worker answered. It stops with the
// worker.
func (w *Worker) ServeMachineName(port int32) error {
	l, err := w.ServeInVM(port)
	if err != nil {
		return fmt.Errorf("serving in VM %s: %w", w.Machine, err)
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(rw, w.Machine) }),
		ReadHeaderTimeout: 5 * time.Second,
	}
	go func() { _ = srv.Serve(l) }() // returns when the worker closes l
	return nil
}

// Get does one HTTP GET of http://host:port/ without keep-alive (each request may land on
// another endpoint) and with a short timeout, and returns the body.
func Get(ctx context.Context, host string, port int32) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, fmt.Sprint(port))+"/", http.NoBody)
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}
