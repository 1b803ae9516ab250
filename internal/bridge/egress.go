package bridge

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"k8s.io/client-go/rest"
)

// EgressRefs are the Services whose reach through the guest apiserver's `cluster` egress
// decides mode Auto for targets: those of the webhooks that reference a Service and are not
// bridged (a bridged one no longer goes through the egress), each once.
func EgressRefs(targets []Target) []ServiceRef {
	var refs []ServiceRef
	for _, t := range targets {
		if t.IsWebhook() && t.Service != nil && t.Record == nil {
			ref := ServiceRef{Namespace: t.Service.Namespace, Name: t.Service.Name, Port: t.Service.Port}
			if !slices.Contains(refs, ref) {
				refs = append(refs, ref)
			}
		}
	}
	return refs
}

// ProbeEgress asks the guest apiserver (cfg) to reach ref: a GET of "/" through its service
// proxy, which dials through the `cluster` egress as a webhook call does, within ProbeTimeout.
func ProbeEgress(ctx context.Context, cfg *rest.Config, ref ServiceRef) EgressCheck {
	code, body, err := proxyGet(ctx, cfg, ref)
	return CheckEgress(ref, code, body, err)
}

func proxyGet(ctx context.Context, cfg *rest.Config, ref ServiceRef) (int, []byte, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return 0, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	u := fmt.Sprintf("%s/api/v1/namespaces/%s/services/https:%s:%d/proxy/",
		strings.TrimSuffix(cfg.Host, "/"), url.PathEscape(ref.Namespace), url.PathEscape(ref.Name), ref.Port)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, http.NoBody)
	if err != nil {
		return 0, nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	// (client-go's typed clients lose the apiserver's message: the body is read as it is.)
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, body, err
}
