// Package scenarios is flexd's end-to-end scenarios on a real Kubernetes cluster, brought up by
// tests/e2e/cluster.sh and run by tests/e2e/run.sh (which builds this package with `go test -c`
// and runs it in the cluster's network namespace, as root). One file per concern; each scenario
// is one spec, labelled with its name (E2E_SCENARIOS picks by label), its steps named with
// ginkgo.By, and every object it makes deleted when it ends, passed or failed, so that one
// failure does not become the next scenario's.
package scenarios

import (
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
)

func TestScenarios(t *testing.T) {
	gomega.RegisterFailHandler(ginkgo.Fail)
	ginkgo.RunSpecs(t, "flexd e2e scenarios")
}

var _ = ginkgo.BeforeSuite(func() {
	cluster = loadCluster()
})

// The scenarios in the order they run: those that make flexd's deployment richer (the
// installer's driver, a controller, the loop driver, the oracle's recorders) come after those
// that check its first, node-only shape; the faults share their pods in order. controller runs
// last but one: its driver is installed and removed between two of kube-controller-manager's probes,
// and that controller's FlexVolume prober then retries the removed driver on every probe for
// good (its log fills with the errors); the oracle and migrate_apply, which go through
// kube-controller-manager, run before that. fence, which installs and removes a driver as well,
// runs just before controller, after every scenario that goes through kube-controller-manager
// (nodeloss, reconciler too). nodes (a volume moved between nodes) and fence skip themselves on
// a single node. rollout (flexd replaced by its next build) comes after upgrade, whose end state
// it starts from; uninstall, which removes flexd and deploys it again, is the very last. A failed
// scenario does not stop the ones after it.
var _ = ginkgo.Describe("flexd", ginkgo.Ordered, ginkgo.ContinueOnFailure, func() {
	ginkgo.It("deploy", ginkgo.Label("deploy"), scenarioDeploy)
	ginkgo.It("preflight", ginkgo.Label("preflight"), scenarioPreflight)
	ginkgo.It("static_pv", ginkgo.Label("static_pv"), scenarioStaticPV)
	ginkgo.It("inline", ginkgo.Label("inline"), scenarioInline)
	ginkgo.It("fsgroup", ginkgo.Label("fsgroup"), scenarioFSGroup)
	ginkgo.It("migrate", ginkgo.Label("migrate"), scenarioMigrate)
	ginkgo.It("installer", ginkgo.Label("installer"), scenarioInstaller)
	ginkgo.It("faults_pod", ginkgo.Label("faults_pod"), scenarioFaultsPod)
	ginkgo.It("faults_kubelet", ginkgo.Label("faults_kubelet"), scenarioFaultsKubelet)
	ginkgo.It("faults_node", ginkgo.Label("faults_node"), scenarioFaultsNode)
	ginkgo.It("storage", ginkgo.Label("storage"), scenarioStorage)
	ginkgo.It("example", ginkgo.Label("example"), scenarioExample)
	ginkgo.It("nodes", ginkgo.Label("nodes"), scenarioNodes)
	ginkgo.It("multiattach", ginkgo.Label("multiattach"), scenarioMultiAttach)
	ginkgo.It("discovery", ginkgo.Label("discovery"), scenarioDiscovery)
	ginkgo.It("oracle", ginkgo.Label("oracle"), scenarioOracle)
	ginkgo.It("migrate_apply", ginkgo.Label("migrate_apply"), scenarioMigrateApply)
	ginkgo.It("migrate_rolling", ginkgo.Label("migrate_rolling"), scenarioMigrateRolling)
	ginkgo.It("nodeloss", ginkgo.Label("nodeloss"), scenarioNodeLoss)
	ginkgo.It("reconciler", ginkgo.Label("reconciler"), scenarioReconciler)
	ginkgo.It("upgrade", ginkgo.Label("upgrade"), scenarioUpgrade)
	ginkgo.It("rollout", ginkgo.Label("rollout"), scenarioRollout)
	ginkgo.It("failover", ginkgo.Label("failover"), scenarioFailover)
	ginkgo.It("fence", ginkgo.Label("fence"), scenarioFence)
	ginkgo.It("controller", ginkgo.Label("controller"), scenarioController)
	ginkgo.It("uninstall", ginkgo.Label("uninstall"), scenarioUninstall)
	// A benchmark (bench/attach-scale.sh), not in run.sh's list.
	ginkgo.It("attach_scale", ginkgo.Label("attach_scale"), scenarioAttachScale)
})
