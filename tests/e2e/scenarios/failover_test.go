package scenarios

// Controller fail-over under load: the replicas leading the loop driver's csi-provisioner and
// csi-attacher are lost while ten pods, each with a volume the loop driver provisions and
// attaches, start. On three nodes or more, the worker running one of them is lost (cluster.sh
// stop-node: every process of it killed) and a leader elsewhere is killed; on fewer, the
// leaders' pods are killed (no grace). The replica left takes over from the records in the API
// server.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	failoverClass = "flexd-failover"
	failoverPods  = 10
)

// scenarioFailover: all ten pods run with their data once the other replica took over; each
// claim has one PV and the loop driver made exactly ten images (none provisioned twice); once
// the pods and claims go, no VolumeAttachment, image or record of them is left.
func scenarioFailover(ctx context.Context) {
	c := cluster
	ginkgo.By("flexd deployed with the loop driver: two controller replicas")
	c.InstallLoop(ctx)
	c.ApplyAllManifests(ctx, "flexd-failover")
	c.WaitCSINodeLists(ctx, loopCSIName)
	gomega.Expect(c.ControllerPods(ctx)).To(gomega.HaveLen(2), "Running controller replicas")
	_, err := c.Kube.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: failoverClass},
		Provisioner: loopCSIName,
	}, metav1.CreateOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	names := make([]string, failoverPods)
	for i := range names {
		names[i] = fmt.Sprintf("failover-%d", i)
	}
	ginkgo.DeferCleanup(c.deleteFailover, names)
	imagesBefore := loopImages(c)

	ginkgo.By("ten claims and pods created, and the replicas leading csi-provisioner and csi-attacher lost")
	provisioner, attacher, lose := c.failoverLeaders(ctx)
	for _, name := range names {
		c.CreateClaim(ctx, name, failoverClass, "16Mi")
		c.CreatePod(ctx, c.ToolsPod(name, "echo "+name+" > /data/name; cat /data/name", ClaimVolume(name), nil))
	}
	start := time.Now()
	killed := []string{provisioner}
	if attacher != provisioner {
		killed = append(killed, attacher)
	}
	how := "killed"
	if lose != "" {
		// The worker of a leader lost; a leader elsewhere killed.
		ginkgo.DeferCleanup(func(ctx context.Context) {
			if !nodeUp(c.NodeNamed(lose)) {
				c.ClusterSh(ctx, "start-node", lose)
			}
		})
		c.ClusterSh(ctx, "stop-node", lose)
		how = "lost with their node " + lose
		for _, pod := range killed {
			if c.controllerPodNode(ctx, pod) != lose {
				c.killReplica(ctx, pod)
				how += ", " + pod + " killed"
			}
		}
	} else {
		for _, pod := range killed {
			c.killReplica(ctx, pod)
		}
	}
	fmt.Fprintf(ginkgo.GinkgoWriter, "%v %s (csi-provisioner's leader %s, csi-attacher's %s)\n", killed, how, provisioner, attacher)

	ginkgo.By("all ten ran with their data, the leases taken over")
	for _, name := range names {
		log := c.PodScriptLog(ctx, name, 420*time.Second)
		gomega.Expect(LogLines(log)).To(gomega.ContainElement(name), "pod %s's log", name)
	}
	took := time.Since(start).Round(time.Second)
	c.NewSummary("failover").Printf("%d pods with provisioned, attached loop volumes ran %s after the controller replicas leading csi-provisioner and csi-attacher (%v) were %s", failoverPods, took, killed, how)
	newProvisioner := c.leaseTakenOver(ctx, "csi-provisioner's leader lease for "+loopCSIName+" taken over", func(lease string) bool {
		return lease == loopCSIName
	}, killed)
	gomega.Expect(killed).NotTo(gomega.ContainElement(newProvisioner), "csi-provisioner's leader after the kill")

	if lose != "" {
		ginkgo.By(lose + " back")
		c.ClusterSh(ctx, "start-node", lose)
	}

	ginkgo.By("one PV per claim, and exactly ten new images: none provisioned twice")
	var volumes []string
	for _, name := range names {
		claim, err := c.Kube.CoreV1().PersistentVolumeClaims(podNamespace).Get(ctx, name, metav1.GetOptions{})
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
		gomega.Expect(claim.Status.Phase).To(gomega.Equal(corev1.ClaimBound), "claim %s", name)
		volumes = append(volumes, claim.Spec.VolumeName)
	}
	pvs, err := c.Kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	classed := 0
	for _, pv := range pvs.Items {
		if pv.Spec.StorageClassName == failoverClass {
			classed++
		}
	}
	gomega.Expect(classed).To(gomega.Equal(failoverPods), "PVs of class %s", failoverClass)
	made := slices.DeleteFunc(loopImages(c), func(image string) bool { return slices.Contains(imagesBefore, image) })
	slices.Sort(made)
	want := make([]string, 0, len(volumes))
	for _, volume := range volumes {
		want = append(want, volume+".img")
	}
	slices.Sort(want)
	gomega.Expect(made).To(gomega.Equal(want), "the images the loop driver made")

	ginkgo.By("the pods and claims deleted: no VolumeAttachment, image or record of them left")
	c.deleteFailover(ctx, names)
	for _, volume := range volumes {
		c.waitDetached(ctx, volume, 180*time.Second)
		gomega.Expect(c.Path("loop-images", volume+".img")).NotTo(gomega.BeAnExistingFile())
		gomega.Expect(c.provisionedRecords(ctx, volume)).To(gomega.Equal(0), "provisioned records of %s", volume)
		gomega.Expect(c.attachmentRecords(ctx, volume)).To(gomega.Equal(0), "attachment records of %s", volume)
	}
}

// failoverLeaders are the controller replicas leading the loop driver's csi-provisioner and
// csi-attacher, and, on three nodes or more, the worker to lose: the node of one of them. When
// both lead from node 0 (it has the control plane: it is never lost), their replica is killed
// with node 0 cordoned, so the leases move to replicas on workers.
func (c *Cluster) failoverLeaders(ctx context.Context) (provisioner, attacher, lose string) {
	ginkgo.GinkgoHelper()
	leaders := func() (string, string) {
		return c.leaseHolder(ctx, "csi-provisioner's leader lease for "+loopCSIName, func(lease string) bool {
				return lease == loopCSIName
			}), c.leaseHolder(ctx, "csi-attacher's leader lease for "+loopCSIName, func(lease string) bool {
				return strings.Contains(lease, "attacher") && strings.HasSuffix(lease, loopCSIName)
			})
	}
	provisioner, attacher = leaders()
	if len(c.Nodes) < 3 {
		return provisioner, attacher, ""
	}
	for attempt := 0; attempt < 3; attempt++ {
		for _, pod := range []string{provisioner, attacher} {
			if node := c.controllerPodNode(ctx, pod); c.NodeNamed(node).Worker() {
				return provisioner, attacher, node
			}
		}
		ginkgo.DeferCleanup(c.Kubectl, "uncordon", c.Node)
		c.MustKubectl(ctx, "cordon", c.Node)
		c.killReplica(ctx, provisioner)
		WaitFor(ctx, 120*time.Second, "csi-provisioner's lease to leave "+provisioner, func(ctx context.Context) error {
			if now, _ := leaders(); now == provisioner {
				return fmt.Errorf("%s still leads", provisioner)
			}
			return nil
		})
		c.MustKubectl(ctx, "uncordon", c.Node)
		provisioner, attacher = leaders()
	}
	ginkgo.Fail(fmt.Sprintf("the leaders %s and %s stay on node 0", provisioner, attacher))
	return
}

// controllerPodNode is the node the controller replica runs on.
func (c *Cluster) controllerPodNode(ctx context.Context, pod string) string {
	ginkgo.GinkgoHelper()
	for _, p := range c.ControllerPods(ctx) {
		if p.Name == pod {
			return p.Spec.NodeName
		}
	}
	ginkgo.Fail("no Running controller replica " + pod)
	return ""
}

// loopImages are the names of the loop driver's image files.
func loopImages(c *Cluster) []string {
	ginkgo.GinkgoHelper()
	entries, err := os.ReadDir(c.Path("loop-images"))
	if os.IsNotExist(err) {
		return nil
	}
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	var images []string
	for _, entry := range entries {
		if filepath.Ext(entry.Name()) == ".img" {
			images = append(images, entry.Name())
		}
	}
	return images
}

// deleteFailover deletes the scenario's pods and claims and waits for their PVs to go (the
// loop driver deletes the images), then its StorageClass.
func (c *Cluster) deleteFailover(ctx context.Context, names []string) {
	var volumes []string
	for _, name := range names {
		c.DeletePodIfThere(ctx, name)
		if claim, err := c.Kube.CoreV1().PersistentVolumeClaims(podNamespace).Get(ctx, name, metav1.GetOptions{}); err == nil && claim.Spec.VolumeName != "" {
			volumes = append(volumes, claim.Spec.VolumeName)
		}
	}
	for _, name := range names {
		c.DeleteClaimIfThere(ctx, name)
	}
	for _, volume := range volumes {
		WaitFor(ctx, 240*time.Second, "PV "+volume+" to be deleted", func(ctx context.Context) error {
			_, err := c.Kube.CoreV1().PersistentVolumes().Get(ctx, volume, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("PV %s is still there (%v)", volume, err)
		})
	}
	err := c.Kube.StorageV1().StorageClasses().Delete(ctx, failoverClass, metav1.DeleteOptions{})
	if !apierrors.IsNotFound(err) {
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
	}
}
