package workerports_test

// Lab test of guestnet_worker_rollouts_total (internal/metrics, docs/metrics.md).
//
// Run with: make test TEST_PKGS=./controllers/workerports/... TEST_ARGS='-run Metrics -v'

import (
	"testing"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/metrics"
)

// A repoint is counted as a rollout; once the workers declare the ports, nothing more is.
// (The environment runs in parallel with the package's other tests, which repoint too: a
// difference of at least one is what this test can tell; alone, with -run Metrics, it is
// exactly one.)
func TestWorkerPortsMetrics_ARepointIsCountedAsARollout(t *testing.T) {
	rollouts := func() float64 {
		n, err := testutil.GatherAndCount(ctrlmetrics.Registry, metrics.WorkerRolloutsName)
		if err != nil || n != 1 {
			t.Fatalf("%s: %d series, %v", metrics.WorkerRolloutsName, n, err)
		}
		families, _ := ctrlmetrics.Registry.Gather()
		for _, f := range families {
			if f.GetName() == metrics.WorkerRolloutsName {
				return f.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return 0
	}
	e := newEnv(t, lab.WorkerTemplateOptions{Ports: []int32{22}})
	before := rollouts()
	e.createBridge("webhooks")
	e.eventuallyRepointed(e.gc.WorkerTemplate)
	e.g.Eventually(rollouts).Should(BeNumerically(">=", before+1))
}
