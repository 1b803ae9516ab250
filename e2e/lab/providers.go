package lab

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
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
