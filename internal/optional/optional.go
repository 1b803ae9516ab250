// Package optional tells whether the optional APIs guestnet uses are served by the host
// apiserver: Cilium's LB-IPAM pool and L2 announcement policy (GuestIngress needs them) and
// CAPK's KubevirtMachineTemplate (the worker ports controller declares ports on it). A
// missing one disables only what needs it: the manager starts, the GuestWebhookBridges work,
// and the objects that need the API say so in a condition. A controller-runtime watch of a
// kind the apiserver does not serve never syncs, and the manager gives up (its controllers'
// CacheSyncTimeout): without this package one missing CRD stopped every controller.
//
// An API installed after the manager started is picked up without a restart: a Gate looks
// for it again every Interval and, once every kind is served, runs what was waiting for it
// (the controllers' watches, a reconcile of the objects that reported it missing). An API
// removed while the manager runs is not noticed (its informers log errors): restart the
// manager after uninstalling one (docs/runbook.md).
package optional

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
)

// DefaultInterval is how often a Gate looks again for an API that is missing.
const DefaultInterval = 30 * time.Second

// API is an optional API: the kinds guestnet reads and writes of it, and what to install.
type API struct {
	// Name names it in messages ("Cilium LB-IPAM").
	Name string
	// Kinds are the kinds guestnet needs; the API is installed when every one is served.
	Kinds []schema.GroupVersionKind
	// Install says what to install, in messages ("install Cilium ...").
	Install string
}

// Gate knows whether one API is installed and runs what waits for it once it is. Its zero
// value is not usable: use NewGate. A nil *Gate is an API taken to be installed (tests and
// callers that do not gate).
type Gate struct {
	api      API
	mapper   meta.RESTMapper
	interval time.Duration

	installed atomic.Bool
	mu        sync.Mutex
	waiting   []func(context.Context) error
}

// NewGate returns a gate for api that asks mapper (the manager's RESTMapper, which asks the
// apiserver's discovery again for a group it does not know) every interval
// (DefaultInterval when zero), and looks once now.
func NewGate(api API, mapper meta.RESTMapper, interval time.Duration) *Gate {
	if interval <= 0 {
		interval = DefaultInterval
	}
	g := &Gate{api: api, mapper: mapper, interval: interval}
	g.installed.Store(g.lookup() == nil)
	return g
}

// API is the API g gates.
func (g *Gate) API() API { return g.api }

// Installed reports whether every kind of the API was served when g last looked.
func (g *Gate) Installed() bool { return g == nil || g.installed.Load() }

// lookup returns why the API is not installed, nil when it is.
func (g *Gate) lookup() error {
	for _, gvk := range g.api.Kinds {
		if _, err := g.mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
			return err
		}
	}
	return nil
}

// kinds names the kinds of the API ("CiliumLoadBalancerIPPool (cilium.io/v2)").
func (a API) kinds() string {
	names := make([]string, len(a.Kinds))
	for i, gvk := range a.Kinds {
		names[i] = fmt.Sprintf("%s (%s)", gvk.Kind, gvk.GroupVersion())
	}
	return strings.Join(names, ", ")
}

// Message says, for a condition, that the API is missing, what to do, and that guestnet picks
// it up by itself.
func (g *Gate) Message() string {
	return fmt.Sprintf("The host apiserver does not serve %s: %s. guestnet looks for %s again every %s and picks it up without a restart",
		g.api.kinds(), g.api.Install, g.api.Name, g.interval)
}

// WhenInstalled runs f once the API is installed: now when it is, else when the gate finds it
// (the gate's context, the manager's, is passed). An error of f is logged; f is not retried.
func (g *Gate) WhenInstalled(ctx context.Context, f func(context.Context) error) error {
	if g == nil {
		return f(ctx)
	}
	g.mu.Lock()
	if !g.installed.Load() {
		g.waiting = append(g.waiting, f)
		g.mu.Unlock()
		return nil
	}
	g.mu.Unlock()
	return f(ctx)
}

// Start implements manager.Runnable: it looks for a missing API every interval until it is
// installed, then runs what waits for it.
func (g *Gate) Start(ctx context.Context) error {
	log := ctrl.LoggerFrom(ctx).WithValues("api", g.api.Name)
	if g.Installed() {
		return nil
	}
	log.Info("Optional API not installed: what needs it is disabled until it is", "kinds", g.api.kinds(), "install", g.api.Install, "lookAgainEvery", g.interval)
	t := time.NewTicker(g.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := g.lookup(); err != nil {
			log.V(4).Info("Optional API still not installed", "reason", err.Error())
			continue
		}
		g.mu.Lock()
		g.installed.Store(true)
		waiting := g.waiting
		g.waiting = nil
		g.mu.Unlock()
		log.Info("Optional API installed: enabling what needs it", "kinds", g.api.kinds())
		for _, f := range waiting {
			if err := f(ctx); err != nil {
				log.Error(err, "Enabling what needs the optional API")
			}
		}
		return nil
	}
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: every replica knows what is
// installed (a controller's watches added before it starts wait for it).
func (g *Gate) NeedLeaderElection() bool { return false }

// IsMissing reports whether err says that the apiserver does not serve the kind read or
// written (an optional API not installed): there is no such object.
func IsMissing(err error) bool { return meta.IsNoMatchError(err) }

// ServedVersion is the first of versions in which the host serves gk, "" when it serves none
// of them (a CRD's served versions change between releases: Cilium serves
// CiliumBGPAdvertisement as v2alpha1 in 1.16 and 1.17, v2 from 1.18 on).
func ServedVersion(mapper meta.RESTMapper, gk schema.GroupKind, versions ...string) string {
	for _, v := range versions {
		if _, err := mapper.RESTMapping(gk, v); err == nil {
			return v
		}
	}
	return ""
}
