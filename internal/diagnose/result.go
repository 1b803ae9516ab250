package diagnose

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Verdict is the outcome of one check.
type Verdict string

const (
	// OK means the item is as it should be.
	OK Verdict = "OK"
	// Warn is worth acting on, but nothing is broken yet (a rollout under way, a weakened
	// webhook, a target not probed yet).
	Warn Verdict = "WARN"
	// Fail means something users will notice is broken.
	Fail Verdict = "FAIL"
)

// severity orders verdicts: the report's verdict is its worst result's.
func (v Verdict) severity() int {
	switch v {
	case Fail:
		return 2
	case Warn:
		return 1
	}
	return 0
}

// The checks, in the order the report lists them.
const (
	CheckCluster              = "cluster"
	CheckGuest                = "guest"
	CheckWorkers              = "workers"
	CheckService              = "service"
	CheckLoadBalancer         = "loadbalancer"
	CheckPorts                = "ports"
	CheckTunnel               = "tunnel"
	CheckAPIService           = "apiservice"
	CheckValidatingWebhook    = "validating-webhook"
	CheckMutatingWebhook      = "mutating-webhook"
	CheckKonnectivity         = "konnectivity"
	CheckControlPlaneEndpoint = "control-plane-endpoint"
	CheckNodeUninitialized    = "node-uninitialized"
	CheckKubeletMode          = "kubelet-mode"
	CheckNodeAddress          = "node-address"
	CheckCiliumNode           = "cilium-node"
	CheckAdmission            = "admission"
	CheckGuestIngress         = "guestingress"
	CheckGuestWebhookBridge   = "guestwebhookbridge"
)

// Result is the verdict of one check on one object.
type Result struct {
	Verdict Verdict `json:"verdict"`
	// Check is what was checked (one of the Check constants).
	Check string `json:"check"`
	// Object names what the check looked at: a Service, a MachineDeployment, an APIService,
	// "<configuration>/<webhook>"; empty for checks of the cluster as a whole.
	Object string `json:"object,omitempty"`
	// Detail is what was found.
	Detail string `json:"detail"`
	// Fix says what to do (WARN and FAIL only).
	Fix string `json:"fix,omitempty"`
	// Runbook is the section of the runbook that explains the failure, e.g.
	// "docs/runbook.md#apiservice-unavailable".
	Runbook string `json:"runbook,omitempty"`
}

// Report is every result for one cluster.
type Report struct {
	Namespace string `json:"namespace"`
	Cluster   string `json:"cluster"`
	// Verdict is the worst verdict of the results.
	Verdict Verdict  `json:"verdict"`
	Results []Result `json:"results"`
}

// Exit codes of the command.
const (
	ExitOK    = 0 // no FAIL
	ExitFail  = 1 // at least one FAIL
	ExitUsage = 2 // bad flags, or the host cluster (or the Cluster) could not be read
)

// ExitCode is 1 when any result is FAIL, else 0.
func (r *Report) ExitCode() int {
	if r.Verdict == Fail {
		return ExitFail
	}
	return ExitOK
}

func (r *Report) add(results ...Result) {
	for _, res := range results {
		if res.Verdict.severity() > r.Verdict.severity() {
			r.Verdict = res.Verdict
		}
		r.Results = append(r.Results, res)
	}
}

// Count returns how many results have verdict v.
func (r *Report) Count(v Verdict) int {
	n := 0
	for _, res := range r.Results {
		if res.Verdict == v {
			n++
		}
	}
	return n
}

// WriteText prints one line per result: "[FAIL] <check> <object>: <detail>. Fix: <fix>
// (docs/runbook.md#...)", then a summary line. What it prints cannot drive a terminal
// (terminalSafe).
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "guestnet diagnose: Cluster %s/%s\n", terminalSafe(r.Namespace), terminalSafe(r.Cluster))
	for _, res := range r.Results {
		b.WriteString(res.Line())
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "%d OK, %d WARN, %d FAIL\n", r.Count(OK), r.Count(Warn), r.Count(Fail))
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON prints the report as one JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// Line renders the result as the text output does, safe for a terminal (terminalSafe).
func (res Result) Line() string {
	return terminalSafe(res.line())
}

func (res Result) line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-6s %s", "["+string(res.Verdict)+"]", res.Check)
	if res.Object != "" {
		b.WriteString(" " + res.Object)
	}
	b.WriteString(": " + strings.TrimSuffix(res.Detail, "."))
	if res.Fix != "" {
		b.WriteString(". Fix: " + strings.TrimSuffix(res.Fix, "."))
	}
	if res.Runbook != "" {
		b.WriteString(" (" + res.Runbook + ")")
	}
	return b.String()
}
