package scenarios

// The deploy scenario: flexd's manifests, applied unmodified, for the node-only hostdir driver.

import (
	"context"
	"slices"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// scenarioDeploy: the node DaemonSet Ready, its CSIDriver, the driver registered with kubelet
// (CSINode), /healthz on the node's loopback and not on its address; no controller side for a
// node-only driver.
func scenarioDeploy(ctx context.Context) {
	c := cluster
	ginkgo.By("applying `flexd manifests --driver " + c.Driver + "`")
	c.ApplyManifests(ctx, "flexd", "--driver", c.Driver)

	ginkgo.By("checking the node DaemonSet is Ready and there is no controller")
	daemonset, err := c.Kube.AppsV1().DaemonSets(c.Namespace).Get(ctx, "flexd-node", metav1.GetOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	gomega.Expect(daemonset.Status.NumberReady).To(gomega.BeEquivalentTo(len(c.Nodes)), "ready node pods (one a node)")
	deployments, err := c.Kube.AppsV1().Deployments(c.Namespace).List(ctx, metav1.ListOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	gomega.Expect(deployments.Items).To(gomega.BeEmpty(), "a node-only driver got a controller Deployment")

	ginkgo.By("checking the CSIDriver " + c.CSIName)
	csidrivers, err := c.Kube.StorageV1().CSIDrivers().List(ctx, metav1.ListOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	gomega.Expect(csidrivers.Items).To(gomega.HaveLen(1), "CSIDrivers")
	csidriver := csidrivers.Items[0]
	gomega.Expect(csidriver.Name).To(gomega.Equal(c.CSIName))
	gomega.Expect(*csidriver.Spec.AttachRequired).To(gomega.BeFalse(), "attachRequired")
	gomega.Expect(*csidriver.Spec.PodInfoOnMount).To(gomega.BeTrue(), "podInfoOnMount")
	gomega.Expect(*csidriver.Spec.FSGroupPolicy).To(gomega.Equal(storagev1.FileFSGroupPolicy), "fsGroupPolicy")
	modes := slices.Clone(csidriver.Spec.VolumeLifecycleModes)
	slices.Sort(modes)
	gomega.Expect(modes).To(gomega.Equal([]storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral, storagev1.VolumeLifecyclePersistent}), "volumeLifecycleModes")

	ginkgo.By("waiting for kubelet to register the driver and for flexd's /healthz")
	c.WaitCSINodeLists(ctx, c.CSIName)
	WaitFor(ctx, 30*time.Second, "flexd's /healthz on 127.0.0.1:9808", healthz("127.0.0.1:9808"))

	ginkgo.By("checking the metrics port is not on the node's address " + c.NodeIP)
	gomega.Expect(healthz(c.NodeIP+":9808")(ctx)).NotTo(gomega.Succeed(), "flexd's metrics port answers on the node's address")
}
