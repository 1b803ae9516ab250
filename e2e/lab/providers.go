package lab

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// What the lab's real Cluster API managers (CAPI core, CAPK) have in common: each runs in a
// pod network namespace of its own, serves health on 127.0.0.1:9440 there, and has its
// admission webhooks registered with url clientConfigs for one namespace.

// waitHealthReady waits until the manager in netns answers /readyz on 127.0.0.1:9440.
func waitHealthReady(ctx context.Context, proc *process, netns *podNetns) error {
	readyCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	probe := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return netns.dial(ctx, addr) },
	}}
	return proc.waitReady(readyCtx, func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:9440/readyz", http.NoBody)
		resp, err := probe.Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz: %s", resp.Status)
		}
		return nil
	})
}

// registerURLWebhooks creates the webhook configurations of a provider's
// config/webhook/manifests.yaml under names prefixed with prefix, each webhook pointing at
// the published server (addr, host:port) by url, with the host CA, and limited to namespace
// ns; webhooks for which skip is true are left out. It returns what it created.
func registerURLWebhooks(ctx context.Context, l *Lab, manifests []byte, prefix, ns, addr string, skip func(hook map[string]any) bool) ([]client.Object, error) {
	objs, err := DecodeObjects(manifests)
	if err != nil {
		return nil, fmt.Errorf("webhook manifests: %w", err)
	}
	caBundle := base64.StdEncoding.EncodeToString(l.Host.CA.CertPEM())
	var created []client.Object
	for _, o := range objs {
		hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
		var kept []any
		for _, h := range hooks {
			hook := h.(map[string]any)
			if skip != nil && skip(hook) {
				continue
			}
			path, _, _ := unstructured.NestedString(hook, "clientConfig", "service", "path")
			hook["clientConfig"] = map[string]any{"url": "https://" + addr + path, "caBundle": caBundle}
			hook["namespaceSelector"] = map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": ns}}
			kept = append(kept, hook)
		}
		if err := unstructured.SetNestedSlice(o.Object, kept, "webhooks"); err != nil {
			return created, err
		}
		o.SetName(prefix + "-" + o.GetName())
		if err := l.Host.Client.Create(ctx, o); err != nil {
			return created, fmt.Errorf("registering webhooks %s: %w", o.GetName(), err)
		}
		created = append(created, o)
	}
	return created, nil
}

// providerManager is one of those managers, running: its pod network namespace, its process
// and the webhook configurations registered for it.
type providerManager struct {
	// WebhookAddress is host:port of the published webhook server.
	WebhookAddress string

	l        *Lab
	netns    *podNetns
	proc     *process
	webhooks []client.Object
	stopOnce sync.Once
}

// start runs bin (logging to <lab>/<name>.log) in a pod network namespace of its own that
// reaches the host and guest apiservers, with a serving certificate for podAddress from the
// host CA in <lab>/<name>-certs, its webhook server (webhookPort inside) published at
// podAddress on a free port, and the flags every such manager takes (admin kubeconfig, no
// leader election, health and diagnostics on loopback inside, the webhook port and
// certificates) then args; and waits until it is ready. On error the caller stops it.
func (m *providerManager) start(ctx context.Context, l *Lab, name, bin, podAddress, certName string, webhookPort int, args ...string) (err error) {
	m.l = l
	certDir := filepath.Join(l.Dir, name+"-certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return err
	}
	if err := l.Host.CA.IssueFiles(certDir, "tls", CertRequest{
		CommonName: certName, IPs: []net.IP{net.ParseIP(podAddress)}, Server: true,
	}); err != nil {
		return err
	}
	if m.netns, err = newPodNetnsTo(l.Dir, name, HostAPIServerAddress, GuestAPIServerAddress); err != nil {
		return err
	}
	if m.WebhookAddress, err = m.netns.publishAt(hostPort(podAddress, 0), webhookPort); err != nil {
		return err
	}
	cmd, cmdArgs := m.netns.command(bin, append([]string{
		"--kubeconfig=" + l.Host.KubeconfigPath,
		"--leader-elect=false",
		"--health-addr=127.0.0.1:9440",
		"--diagnostics-address=127.0.0.1:8443",
		"--insecure-diagnostics",
		fmt.Sprintf("--webhook-port=%d", webhookPort),
		"--webhook-cert-dir=" + certDir,
	}, args...)...)
	if m.proc, err = startProcess(l.Dir, name, cmd, cmdArgs...); err != nil {
		return err
	}
	return waitHealthReady(ctx, m.proc, m.netns)
}

// Stop removes the webhook configurations and stops the manager; what it wrote stays.
func (m *providerManager) Stop() {
	m.stopOnce.Do(func() {
		if m.l != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for _, o := range m.webhooks {
				_ = m.l.Host.Client.Delete(ctx, o)
			}
		}
		m.proc.stop()
		if m.netns != nil {
			m.netns.close()
		}
	})
}

// LogPath is the manager's log file.
func (m *providerManager) LogPath() string { return m.proc.logPath }
