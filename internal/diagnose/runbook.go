package diagnose

// Sections of docs/runbook.md a result points at. The fixes the checks print use the
// runbook's wording; the runbook gives the longer story, the kubectl commands and the normal
// and abnormal output.
const (
	runbookDoc = "docs/runbook.md"

	rbGuestUnreachable     = runbookDoc + "#guest-unreachable"
	rbKubeconfigRefused    = runbookDoc + "#kubeconfig-refused"
	rbNoWorkers            = runbookDoc + "#no-worker-pods"
	rbNoEndpoints          = runbookDoc + "#ingress-no-endpoints"
	rbUndeclaredPort       = runbookDoc + "#ingress-undeclared-port"
	rbTunnelPort           = runbookDoc + "#ingress-tunnel-port"
	rbNoIP                 = runbookDoc + "#ingress-no-ip"
	rbWorkerRollout        = runbookDoc + "#worker-rollout"
	rbRepointStopped       = runbookDoc + "#worker-repoint-stopped"
	rbAPIServiceAvailable  = runbookDoc + "#apiservice-unavailable"
	rbWebhookFailed        = runbookDoc + "#webhook-failed-calling"
	rbTLS                  = runbookDoc + "#tls-name-mismatch"
	rbKonnectivity         = runbookDoc + "#konnectivity"
	rbHelmRevert           = runbookDoc + "#helm-revert"
	rbWeakened             = runbookDoc + "#weakened-webhook"
	rbOrphaned             = runbookDoc + "#bridge-gone"
	rbManager              = runbookDoc + "#manager-not-reconciling"
	rbNotAdmitted          = runbookDoc + "#ingress-not-admitted"
	rbNodeAddress          = runbookDoc + "#node-address"
	rbNodeUninitialized    = runbookDoc + "#node-uninitialized"
	rbKubeletNotExternal   = runbookDoc + "#kubelet-not-external"
	rbCiliumNodeIP         = runbookDoc + "#cilium-node-ip"
	rbControlPlaneEndpoint = runbookDoc + "#control-plane-endpoint"
)

// Fixes shared by several checks, in the runbook's words.
const (
	fixManager = "check that guestnet's manager runs and watches this namespace " +
		"(kubectl logs -n guestnet-system deploy/guestnet-controller-manager; its --namespace and --watch-filter flags)"
	fixGuestUnreachable = "check the guest control plane pods and the <cluster>-kubeconfig Secret; " +
		"guestnet changes nothing in a guest it cannot reach"
	fixKubeconfigRefused = "correct the <cluster>-kubeconfig Secret as each refused field says: inline credentials " +
		"(client-certificate-data and client-key-data, or token), inline certificate-authority-data, and the Cluster's " +
		"spec.controlPlaneEndpoint as server (a tenant may have written it: see who did). diagnose never runs, reads or dials " +
		"what the Secret names; to read the guest anyway, pass a kubeconfig of your own with --guest-kubeconfig (used as it is)"
	fixUnprobed = "wait for the bridge's next probe (every 10 s while a target is not reachable), " +
		"or run diagnose with --probe from where host ClusterIPs are reachable (a pod or node of the host)"
)
