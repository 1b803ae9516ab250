// Package faultclient wraps a controller-runtime client so that a test can make a manager
// "crash" at any write: after a given number of writes, every further write fails without
// reaching the apiserver and a callback runs (a test cancels the manager there). The fault
// tests kill a reconcile at its 1st, 2nd, ... Nth write, restart, and check that guestnet
// converges with nothing lost or duplicated.
package faultclient

import (
	"context"
	"errors"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ErrCrashed is what every write returns once the budget is spent.
var ErrCrashed = errors.New("faultclient: the manager crashed before this write")

// Budget counts writes across every client wrapped with it (host and guest).
type Budget struct {
	mu      sync.Mutex
	left    int
	crashed bool
	// OnCrash runs once, when the first write past the budget is attempted.
	OnCrash func()
	// Writes records every write let through, "verb kind namespace/name", in order.
	Writes []string
}

// NewBudget lets n writes through; the (n+1)th and later fail with ErrCrashed. n < 0 lets
// every write through (a recording run, to learn how many writes a reconcile makes).
func NewBudget(n int, onCrash func()) *Budget { return &Budget{left: n, OnCrash: onCrash} }

// Crashed reports whether the budget was exceeded.
func (b *Budget) Crashed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.crashed
}

// Recorded returns a copy of Writes, safe to call while the manager runs.
func (b *Budget) Recorded() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.Writes...)
}

func (b *Budget) take(verb string, obj runtime.Object) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.crashed {
		return ErrCrashed
	}
	if b.left == 0 {
		b.crashed = true
		if b.OnCrash != nil {
			go b.OnCrash()
		}
		return ErrCrashed
	}
	if b.left > 0 {
		b.left--
	}
	b.Writes = append(b.Writes, describe(verb, obj))
	return nil
}

func describe(verb string, obj runtime.Object) string {
	kind := obj.GetObjectKind().GroupVersionKind().Kind
	if kind == "" {
		kind = typeName(obj)
	}
	if o, ok := obj.(client.Object); ok {
		return verb + " " + kind + " " + client.ObjectKeyFromObject(o).String()
	}
	return verb + " " + kind
}

// Wrap returns c with its writes (including status and other subresource writes) charged to b.
func Wrap(c client.Client, b *Budget) client.Client { return &faultClient{Client: c, budget: b} }

type faultClient struct {
	client.Client
	budget *Budget
}

func (c *faultClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if err := c.budget.take("create", obj); err != nil {
		return err
	}
	return c.Client.Create(ctx, obj, opts...)
}

func (c *faultClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if err := c.budget.take("update", obj); err != nil {
		return err
	}
	return c.Client.Update(ctx, obj, opts...)
}

func (c *faultClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if err := c.budget.take("patch", obj); err != nil {
		return err
	}
	return c.Client.Patch(ctx, obj, patch, opts...)
}

func (c *faultClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	if err := c.budget.take("apply", applyObject{obj}); err != nil {
		return err
	}
	return c.Client.Apply(ctx, obj, opts...)
}

func (c *faultClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	if err := c.budget.take("delete", obj); err != nil {
		return err
	}
	return c.Client.Delete(ctx, obj, opts...)
}

func (c *faultClient) DeleteAllOf(ctx context.Context, obj client.Object, opts ...client.DeleteAllOfOption) error {
	if err := c.budget.take("deletecollection", obj); err != nil {
		return err
	}
	return c.Client.DeleteAllOf(ctx, obj, opts...)
}

func (c *faultClient) Status() client.SubResourceWriter { return c.SubResource("status") }

func (c *faultClient) SubResource(subResource string) client.SubResourceClient {
	return &faultSubResource{SubResourceClient: c.Client.SubResource(subResource), name: subResource, budget: c.budget}
}

type faultSubResource struct {
	client.SubResourceClient
	name   string
	budget *Budget
}

func (c *faultSubResource) Create(ctx context.Context, obj, sub client.Object, opts ...client.SubResourceCreateOption) error {
	if err := c.budget.take("create/"+c.name, obj); err != nil {
		return err
	}
	return c.SubResourceClient.Create(ctx, obj, sub, opts...)
}

func (c *faultSubResource) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if err := c.budget.take("update/"+c.name, obj); err != nil {
		return err
	}
	return c.SubResourceClient.Update(ctx, obj, opts...)
}

func (c *faultSubResource) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if err := c.budget.take("patch/"+c.name, obj); err != nil {
		return err
	}
	return c.SubResourceClient.Patch(ctx, obj, patch, opts...)
}

func (c *faultSubResource) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	if err := c.budget.take("apply/"+c.name, applyObject{obj}); err != nil {
		return err
	}
	return c.SubResourceClient.Apply(ctx, obj, opts...)
}
