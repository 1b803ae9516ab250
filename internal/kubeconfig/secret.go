package kubeconfig

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/secret"
)

// FromSecret returns the checked kubeconfig (Check) of s, the <cluster>-kubeconfig Secret of
// cluster: its key "value", as Cluster API writes it (util/kubeconfig in
// sigs.k8s.io/cluster-api v1.14.2), against the Cluster's spec.controlPlaneEndpoint. A
// refusal is a *RefusedError that names the Secret.
func FromSecret(s *corev1.Secret, cluster *clusterv1.Cluster) ([]byte, error) {
	source := fmt.Sprintf("Secret %s/%s", s.Namespace, s.Name)
	data, ok := s.Data[secret.KubeconfigDataName]
	if !ok {
		return nil, &RefusedError{Source: source, Problems: []Problem{{
			Field: "data." + secret.KubeconfigDataName, Why: "is missing",
			Fix: "put the guest cluster's kubeconfig under the key " + secret.KubeconfigDataName,
		}}}
	}
	checked, err := Check(data, cluster.Spec.ControlPlaneEndpoint)
	if refused, ok := AsRefused(err); ok {
		refused.Source = source
	}
	return checked, err
}

// SecretReader is the client.Reader the ClusterCache reads the <cluster>-kubeconfig Secrets
// through (clustercache.Options.SecretClient): a Secret it returns holds, under "value", only
// the checked kubeconfig (FromSecret), so whatever the ClusterCache builds from it (clients,
// caches, REST configs, watches) uses nothing a tenant could name but the Cluster's endpoint
// and inline credentials. A refused Secret is an error (a *RefusedError): the ClusterCache
// then does not connect, and retries every 30 s.
type SecretReader struct {
	// Reader reads the Secrets and their Clusters (the manager's cache).
	Reader client.Reader
}

var _ client.Reader = SecretReader{}

// Get reads the <cluster>-kubeconfig Secret key into obj (a *corev1.Secret) and replaces its
// data with the checked kubeconfig.
func (r SecretReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	s, ok := obj.(*corev1.Secret)
	if !ok {
		return fmt.Errorf("kubeconfig.SecretReader reads Secrets only, not %T", obj)
	}
	clusterName, ok := strings.CutSuffix(key.Name, "-"+string(secret.Kubeconfig))
	if !ok || clusterName == "" {
		return fmt.Errorf("kubeconfig.SecretReader reads <cluster>-kubeconfig Secrets only, not %s", key)
	}
	if err := r.Reader.Get(ctx, key, s, opts...); err != nil {
		return err
	}
	cluster := &clusterv1.Cluster{}
	if err := r.Reader.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: clusterName}, cluster); err != nil {
		return fmt.Errorf("getting Cluster %s/%s of Secret %s: %w", key.Namespace, clusterName, key.Name, err)
	}
	checked, err := FromSecret(s, cluster)
	if err != nil {
		return err
	}
	s.Data = map[string][]byte{secret.KubeconfigDataName: checked}
	return nil
}

// List is not supported: the ClusterCache reads one Secret at a time, and a list would hand
// out unchecked kubeconfigs.
func (r SecretReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errors.New("kubeconfig.SecretReader reads single <cluster>-kubeconfig Secrets only")
}

// Refusal returns why the <cluster>-kubeconfig Secret of cluster is refused, or nil when it
// is not (or cannot be read: the ClusterCache reports that itself).
func (r SecretReader) Refusal(ctx context.Context, cluster client.ObjectKey) *RefusedError {
	key := client.ObjectKey{Namespace: cluster.Namespace, Name: secret.Name(cluster.Name, secret.Kubeconfig)}
	refused, _ := AsRefused(r.Get(ctx, key, &corev1.Secret{}))
	return refused
}
