package kubeconfig

import (
	"bytes"
	"errors"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// FuzzCheck: whatever kubeconfig and endpoint come in, Check either refuses (a *RefusedError
// with at least one problem, each with a field, a reason and a fix) or returns a kubeconfig
// that client-go turns into a rest.Config without exec plugin, auth provider, file, proxy,
// insecure TLS, basic authentication or impersonation, whose host is the endpoint (and not a
// special-purpose address), with inline CA data and a credential; and that Check accepts
// unchanged. The seed corpus (testdata/fuzz/FuzzCheck) holds a kubeconfig of each kind
// Check accepts or refuses. Run it longer with
// go test ./internal/kubeconfig -run '^$' -fuzz FuzzCheck -fuzztime 2m -fuzzminimizetime 2s (new inputs are
// kubeconfigs of a few KiB: minimizing each for the default minute stalls the run)
func FuzzCheck(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte, host string, port int32) {
		endpoint := clusterv1.APIEndpoint{Host: host, Port: port}
		out, err := Check(data, endpoint)
		if err != nil {
			refused, ok := AsRefused(err)
			if !ok {
				t.Fatalf("Check failed without a refusal: %v", err)
			}
			if out != nil || len(refused.Problems) == 0 {
				t.Fatalf("a refusal returns no kubeconfig and names a problem: %q, %v", out, err)
			}
			for _, p := range refused.Problems {
				if p.Field == "" || p.Why == "" || p.Fix == "" {
					t.Fatalf("a problem without field, reason or fix: %+v", p)
				}
			}
			return
		}
		cfg, err := clientcmd.RESTConfigFromKubeConfig(out)
		if err != nil {
			t.Fatalf("client-go cannot read what Check returned: %v\n%s", err, out)
		}
		expectOnlyInlineConfig(t, cfg, endpoint)
		again, err := Check(out, endpoint)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("Check does not accept what it returned unchanged: %v\n%s\n%s", err, out, again)
		}
	})
}

// expectOnlyInlineConfig checks, with client-go's rest.Config and the standard library's
// own address predicates (independently of Check), what a checked kubeconfig may hold.
func expectOnlyInlineConfig(t *testing.T, cfg *rest.Config, endpoint clusterv1.APIEndpoint) {
	t.Helper()
	switch {
	case cfg.ExecProvider != nil:
		t.Fatalf("exec plugin: %+v", cfg.ExecProvider)
	case cfg.AuthProvider != nil:
		t.Fatalf("auth provider: %+v", cfg.AuthProvider)
	case cfg.CAFile != "" || cfg.CertFile != "" || cfg.KeyFile != "" || cfg.BearerTokenFile != "":
		t.Fatalf("a file: %q %q %q %q", cfg.CAFile, cfg.CertFile, cfg.KeyFile, cfg.BearerTokenFile)
	case cfg.Proxy != nil:
		t.Fatalf("a proxy")
	case cfg.Insecure:
		t.Fatalf("insecure TLS")
	case cfg.Username != "" || cfg.Password != "":
		t.Fatalf("basic authentication")
	case cfg.Impersonate.UserName != "" || cfg.Impersonate.UID != "" || len(cfg.Impersonate.Groups) > 0 || len(cfg.Impersonate.Extra) > 0:
		t.Fatalf("impersonation: %+v", cfg.Impersonate)
	case len(cfg.CAData) == 0:
		t.Fatalf("no inline CA")
	case len(cfg.CertData) == 0 && cfg.BearerToken == "":
		t.Fatalf("no credential")
	}

	u, err := url.Parse(cfg.Host)
	if err != nil || u.Scheme != "https" || u.Path != "" || u.User != nil || u.RawQuery != "" {
		t.Fatalf("host %q is not https://<host>:<port>: %v", cfg.Host, err)
	}
	if u.Port() != strconv.Itoa(int(endpoint.Port)) {
		t.Fatalf("host %q is not on the endpoint's port %d", cfg.Host, endpoint.Port)
	}
	want := strings.TrimSuffix(strings.TrimPrefix(endpoint.Host, "["), "]")
	if a, err := netip.ParseAddr(want); err == nil {
		got, err := netip.ParseAddr(u.Hostname())
		if err != nil || got != a.Unmap() {
			t.Fatalf("host %q is not the endpoint %s", cfg.Host, endpoint.Host)
		}
		if got.IsLoopback() || got.IsLinkLocalUnicast() || got.IsUnspecified() || got.IsMulticast() || got.IsLinkLocalMulticast() {
			t.Fatalf("host %q is a special-purpose address", cfg.Host)
		}
		return
	}
	if !strings.EqualFold(u.Hostname(), strings.TrimSuffix(want, ".")) {
		t.Fatalf("host %q is not the endpoint %s", cfg.Host, endpoint.Host)
	}
	if _, err := netip.ParseAddr(u.Hostname()); err == nil {
		t.Fatalf("the endpoint %q is a name, the host %q an address", endpoint.Host, cfg.Host)
	}
}

// The seed corpus holds kubeconfigs Check accepts and ones it refuses (its certificates
// stay valid PEM): the fuzzer starts from both sides.
func TestFuzzCheckCorpus(t *testing.T) {
	accepted := map[string]bool{"capi": true, "token": true, "dns": true, "ipv6": true, "mapped": true, "json": true, "othercontext": true}
	entries, err := os.ReadDir(filepath.Join("testdata", "fuzz", "FuzzCheck"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join("testdata", "fuzz", "FuzzCheck", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
		if len(lines) != 4 || lines[0] != "go test fuzz v1" {
			t.Fatalf("%s: not a corpus entry of (data, host, port)", e.Name())
		}
		data, err1 := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")"))
		host, err2 := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[2], "string("), ")"))
		port, err3 := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(lines[3], "int32("), ")"), 10, 32)
		if err := errors.Join(err1, err2, err3); err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		_, err = Check([]byte(data), clusterv1.APIEndpoint{Host: host, Port: int32(port)})
		if accepted[e.Name()] != (err == nil) {
			t.Errorf("%s: accepted %v, want %v: %v", e.Name(), err == nil, accepted[e.Name()], err)
		}
		delete(accepted, e.Name())
	}
	if len(accepted) > 0 {
		t.Errorf("missing from the corpus: %v", accepted)
	}
}
