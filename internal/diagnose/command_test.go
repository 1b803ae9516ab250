package diagnose

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
)

func TestDiagnose_ReportOutput(t *testing.T) {
	g := NewWithT(t)
	rep := &Report{Namespace: ns, Cluster: clusterName, Verdict: OK}
	rep.add(
		Result{Verdict: OK, Check: CheckWorkers, Detail: "2 virt-launcher pods (2 ready)"},
		Result{Verdict: Fail, Check: CheckAPIService, Object: metricsAPI, Detail: "Available=False (FailedDiscoveryCheck): x.", Fix: "bridge it.", Runbook: rbAPIServiceAvailable},
		Result{Verdict: Warn, Check: CheckPorts, Object: mdName, Detail: "rolling out", Fix: "wait"},
	)
	g.Expect(rep.Verdict).To(Equal(Fail))
	g.Expect(rep.ExitCode()).To(Equal(ExitFail))

	var text bytes.Buffer
	g.Expect(rep.WriteText(&text)).To(Succeed())
	g.Expect(text.String()).To(Equal(`guestnet diagnose: Cluster k0smotron/tenant-a
[OK]   workers: 2 virt-launcher pods (2 ready)
[FAIL] apiservice v1beta1.metrics.k8s.io: Available=False (FailedDiscoveryCheck): x. Fix: bridge it (docs/runbook.md#apiservice-unavailable)
[WARN] ports tenant-a-md-0: rolling out. Fix: wait
1 OK, 1 WARN, 1 FAIL
`))

	var out bytes.Buffer
	g.Expect(rep.WriteJSON(&out)).To(Succeed())
	var back Report
	g.Expect(json.Unmarshal(out.Bytes(), &back)).To(Succeed())
	g.Expect(back).To(Equal(*rep))
	g.Expect(out.String()).To(ContainSubstring(`"verdict": "FAIL"`))
}

func TestDiagnose_RunUsage(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{name: "help", args: []string{"--help"}, code: ExitOK, stderr: "Usage: manager diagnose --namespace <ns> --cluster <name>"},
		{name: "no cluster", args: []string{"-n", "k0smotron"}, code: ExitUsage, stderr: "--namespace and --cluster are required"},
		{name: "bad output", args: []string{"-n", "k0smotron", "--cluster", "tenant-a", "-o", "yaml"}, code: ExitUsage, stderr: `--output must be text or json, not "yaml"`},
		{name: "unknown flag", args: []string{"--bogus"}, code: ExitUsage, stderr: "unknown flag: --bogus"},
		{name: "extra argument", args: []string{"-n", "a", "--cluster", "b", "c"}, code: ExitUsage, stderr: `unexpected arguments ["c"]`},
		{name: "missing kubeconfig", args: []string{"-n", "a", "--cluster", "b", "--kubeconfig", filepath.Join(os.TempDir(), "does-not-exist")}, code: ExitUsage, stderr: "loading the host kubeconfig"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			var stdout, stderr bytes.Buffer
			g.Expect(Run(context.Background(), tt.args, &stdout, &stderr)).To(Equal(tt.code), stderr.String())
			g.Expect(stderr.String()).To(ContainSubstring(tt.stderr))
			g.Expect(stdout.String()).To(BeEmpty())
		})
	}
}
