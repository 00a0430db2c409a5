package scenarios

// Migration (docs/migration.md#cut-over): a FlexVolume PV, mounted by kubelet's own FlexVolume
// plugin, moved to flexd with `flexd migrate`, its data kept.

import (
	"context"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// scenarioMigrate: data written through kubelet's FlexVolume plugin from the same plugin dir;
// the cut-over as docs/migration.md says it; a new pod reads the same data through flexd.
func scenarioMigrate(ctx context.Context) {
	c := cluster
	ginkgo.By("a FlexVolume PV, a pod writing to it through kubelet's FlexVolume plugin")
	c.StaticClaim(ctx, PersistentVolume("e2e-migrate", "1Gi", FlexSource(c.Driver, map[string]string{"greeting": "through FlexVolume"})))
	log := c.RunPod(ctx, c.ToolsPod("e2e-migrate-before", "cat /data/driver; echo before-migration > /data/payload", ClaimVolume("e2e-migrate"), nil), 180*time.Second)
	gomega.Expect(LogLines(log)).To(gomega.ContainElement("hostdir e2e-migrate through FlexVolume"))
	// kubelet's FlexVolume plugin mounted it: its dir, not the CSI plugin's.
	target := c.Path("kubelet", "pods", c.PodUID(ctx, "e2e-migrate-before"), "volumes", pluginDirName(c.Driver), "e2e-migrate")
	gomega.Expect(MountCount(target)).To(gomega.Equal(1), "mounts of %s", target)
	c.DeletePod(ctx, "e2e-migrate-before")
	WaitFor(ctx, 60*time.Second, target+" to be unmounted", notMounted(target))

	ginkgo.By("the cut-over: `kubectl get pv -o yaml | flexd migrate -f -`, the PV replaced")
	pvYAML := c.WriteRun("e2e-migrate-flex.yaml", c.MustKubectl(ctx, "get", "pv", "e2e-migrate", "-o", "yaml"))
	migrated := c.MustFlexd(ctx, "migrate", "-f", pvYAML)
	migratedPath := c.WriteRun("migrated.yaml", migrated)
	c.DeletePVIfThere(ctx, "e2e-migrate")
	c.MustKubectl(ctx, "create", "-f", migratedPath)
	pv, err := c.Kube.CoreV1().PersistentVolumes().Get(ctx, "e2e-migrate", metav1.GetOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	gomega.Expect(pv.Spec.CSI).NotTo(gomega.BeNil(), "the migrated PV's CSI source:\n%s", migrated)
	gomega.Expect(pv.Spec.CSI.Driver).To(gomega.Equal(c.CSIName))
	c.WaitClaimBound(ctx, "e2e-migrate", 120*time.Second)

	ginkgo.By("a new pod reads the same data through flexd")
	log = c.RunPod(ctx, c.ToolsPod("e2e-migrate-after", "cat /data/driver /data/payload", ClaimVolume("e2e-migrate"), nil), 180*time.Second)
	gomega.Expect(LogLines(log)).To(gomega.ContainElements("hostdir e2e-migrate through FlexVolume", "before-migration"))
	target = c.VolumeTarget(c.PodUID(ctx, "e2e-migrate-after"), "e2e-migrate")
	gomega.Expect(MountCount(target)).To(gomega.Equal(1), "mounts of %s", target)
	c.DeletePod(ctx, "e2e-migrate-after")
	WaitFor(ctx, 60*time.Second, target+" to be unmounted", notMounted(target))
}
