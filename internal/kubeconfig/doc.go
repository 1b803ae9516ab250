// Package kubeconfig is where guestnet reads the kubeconfig of a guest cluster: the
// <cluster>-kubeconfig Secret, which a tenant can write. Its content is untrusted input
// (docs/decisions/0006-untrusted-kubeconfigs.md): client-go, used as it is, runs exec
// plugins, loads auth providers, reads the files a kubeconfig names, sends through the proxy
// it names and dials any server, all with the rights of whoever reads it (guestnet's manager,
// or the admin running `manager diagnose`).
//
// Check is the one check every reader uses: it takes the current context's cluster and user
// only, refuses whatever would run, read or send anything outside guestnet (naming the field
// and what to write instead), pins the server to the Cluster's spec.controlPlaneEndpoint and
// returns a kubeconfig that holds nothing but the endpoint, inline CA data and inline
// credentials. SecretReader applies it where the data enters the ClusterCache (its
// SecretClient), so every client, cache, REST config and watch the ClusterCache hands out is
// built from a checked kubeconfig; ClusterCache makes the ClusterCache's "not connected" say
// why when the reason is a refusal.
package kubeconfig
