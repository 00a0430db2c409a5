package scenarios

// The controller side, for a driver whose attach sets up no device (examples/drivers/attachable
// as e2e/attach): the manifests' controller runs unprivileged, and the real csi-attacher
// attaches through flexd.

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

const (
	attachDriver  = "e2e/attach"
	attachCSIName = "flexvolume-e2e--attach"
)

// attachmentOf is the attached status of the PV's VolumeAttachment, "" when it has none.
func (c *Cluster) attachmentOf(ctx context.Context, pv string) (string, error) {
	attachments, err := c.Kube.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	for _, attachment := range attachments.Items {
		if name := attachment.Spec.Source.PersistentVolumeName; name != nil && *name == pv {
			return fmt.Sprint(attachment.Status.Attached), nil
		}
	}
	return "", nil
}

// scenarioController: the manifests' controller runs as two unprivileged replicas (root with
// CHOWN alone, no /dev, no sidecar token), its non-root csi-attacher attaches through the 0660
// socket, a pod writes to the volume (attach, then on the node mountdevice and the default bind
// mount), and the attachment is recorded in the API server. The replica leading csi-attacher
// is killed: the other detaches what the first attached, and attaches a new pod's volume.
func scenarioController(ctx context.Context) {
	c := cluster
	ginkgo.By("the attachable example driver installed as " + attachDriver)
	// On every node: the controller pod, wherever it runs, reads its own node's plugin dir.
	c.MustFlexdEverywhere(ctx, "install", "--driver", attachDriver, filepath.Join(c.Repo, "examples", "drivers", "attachable", "attachable"))
	ginkgo.DeferCleanup(func(ctx context.Context) {
		c.FlexdEverywhere(ctx, "uninstall", "--driver", attachDriver)
		err := c.Kube.StorageV1().CSIDrivers().Delete(ctx, attachCSIName, metav1.DeleteOptions{})
		if !apierrors.IsNotFound(err) {
			gomega.Expect(err).NotTo(gomega.HaveOccurred())
		}
	})

	ginkgo.By("flexd's manifests for both drivers, a controller with csi-attacher")
	c.ApplyManifests(ctx, "flexd-controller", append([]string{"--driver", c.Driver, "--driver", attachDriver}, c.SidecarImageFlags...)...)
	c.WaitCSINodeLists(ctx, attachCSIName)

	ginkgo.By("checking the controller is hardened and unprivileged")
	c.ExpectControllerHardened(ctx, attachCSIName, "csi-attacher")

	ginkgo.By("a pod writing to an attached volume")
	c.StaticClaim(ctx, PersistentVolume("e2e-attach", "1Gi", CSISource(attachCSIName, "e2e-attach", map[string]string{"greeting": "attached"})))
	log := c.RunPod(ctx, c.ToolsPod("e2e-attach", "echo attached-by-pod > /data/pod; cat /data/pod", ClaimVolume("e2e-attach"), nil), 180*time.Second)
	gomega.Expect(LogLines(log)).To(gomega.ContainElement("attached-by-pod"))
	gomega.Expect(c.attachmentOf(ctx, "e2e-attach")).To(gomega.Equal("true"), "the VolumeAttachment of e2e-attach")
	target := c.VolumeTarget(c.PodUID(ctx, "e2e-attach"), "e2e-attach")
	gomega.Expect(MountCount(target)).To(gomega.Equal(1), "mounts of %s", target)

	ginkgo.By("two replicas, the attachment recorded in the API server, by a token allowed nothing else")
	gomega.Expect(c.ControllerPods(ctx)).To(gomega.HaveLen(2), "Running controller replicas")
	gomega.Expect(c.attachmentRecords(ctx, "e2e-attach")).To(gomega.Equal(1), "attachment records of e2e-attach")
	c.expectRecordsTokenNarrow(ctx)

	ginkgo.By("the replica leading csi-attacher killed: the other detaches what it attached")
	leader := c.attacherLeader(ctx)
	c.killReplica(ctx, leader)
	c.DeletePod(ctx, "e2e-attach")
	WaitFor(ctx, 60*time.Second, target+" to be unmounted", notMounted(target))
	c.waitDetached(ctx, "e2e-attach", 240*time.Second)
	gomega.Expect(c.attachmentRecords(ctx, "e2e-attach")).To(gomega.Equal(0), "attachment records of e2e-attach once detached")
	gomega.Expect(c.attacherLeader(ctx)).NotTo(gomega.Equal(leader), "csi-attacher's leader after the kill")

	ginkgo.By("a new pod attaches through the replica that took over")
	c.StaticClaim(ctx, PersistentVolume("e2e-attach-2", "1Gi", CSISource(attachCSIName, "e2e-attach-2", map[string]string{"greeting": "again"})))
	log = c.RunPod(ctx, c.ToolsPod("e2e-attach-2", "echo after-failover > /data/pod; cat /data/pod", ClaimVolume("e2e-attach-2"), nil), 180*time.Second)
	gomega.Expect(LogLines(log)).To(gomega.ContainElement("after-failover"))
	gomega.Expect(c.attachmentOf(ctx, "e2e-attach-2")).To(gomega.Equal("true"), "the VolumeAttachment of e2e-attach-2")
	gomega.Expect(c.attachmentRecords(ctx, "e2e-attach-2")).To(gomega.Equal(1), "attachment records of e2e-attach-2")

	ginkgo.By("the pods deleted: unmounted and detached")
	c.DeletePod(ctx, "e2e-attach-2")
	c.waitDetached(ctx, "e2e-attach-2", 120*time.Second)
	gomega.Expect(c.attachmentRecords(ctx, "e2e-attach-2")).To(gomega.Equal(0), "attachment records of e2e-attach-2 once detached")
	for _, volume := range []string{"e2e-attach", "e2e-attach-2"} {
		c.DeleteClaimIfThere(ctx, volume)
		c.DeletePVIfThere(ctx, volume)
	}
	c.MustFlexdEverywhere(ctx, "uninstall", "--driver", attachDriver)
}

// waitDetached waits for the PV's VolumeAttachment to go.
func (c *Cluster) waitDetached(ctx context.Context, pv string, timeout time.Duration) {
	ginkgo.GinkgoHelper()
	WaitFor(ctx, timeout, "the VolumeAttachment of "+pv+" to go", func(ctx context.Context) error {
		attached, err := c.attachmentOf(ctx, pv)
		if err != nil {
			return err
		}
		if attached != "" {
			return fmt.Errorf("the VolumeAttachment of %s is still there (attached: %s)", pv, attached)
		}
		return nil
	})
}

// flexdRecords is the resource the controller keeps its records as.
var flexdRecords = schema.GroupVersionResource{Group: "flexd.io", Version: "v1alpha1", Resource: "flexdrecords"}

// attachmentRecords counts the controller's attachments of a volume: the entries (one a node)
// of spec.attachments in its FlexdRecord (one object a volume, spec.volume its CSI volume id);
// 0 when it has none.
func (c *Cluster) attachmentRecords(ctx context.Context, volume string) (int, error) {
	records, err := c.flexdRecordsOf(ctx, volume)
	if err != nil {
		return 0, err
	}
	count := 0
	for _, record := range records {
		attachments, _, err := unstructured.NestedMap(record.Object, "spec", "attachments")
		if err != nil {
			return 0, fmt.Errorf("FlexdRecord %s: spec.attachments: %w", record.GetName(), err)
		}
		count += len(attachments)
	}
	return count, nil
}

// provisionedRecords counts the controller's provisioned records of a volume: 1 when its
// FlexdRecord holds spec.provisioned (done or not), else 0.
func (c *Cluster) provisionedRecords(ctx context.Context, volume string) (int, error) {
	records, err := c.flexdRecordsOf(ctx, volume)
	if err != nil {
		return 0, err
	}
	count := 0
	for _, record := range records {
		if _, found, _ := unstructured.NestedFieldNoCopy(record.Object, "spec", "provisioned"); found {
			count++
		}
	}
	return count, nil
}

// flexdRecordsOf are the controller's FlexdRecords in flexd's namespace whose spec.volume is the
// volume: one object a volume (and driver), holding its fence, its provisioned volume and its
// attachments, deleted once it holds none of them.
func (c *Cluster) flexdRecordsOf(ctx context.Context, volume string) ([]unstructured.Unstructured, error) {
	client, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return nil, err
	}
	list, err := client.Resource(flexdRecords).Namespace(c.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var records []unstructured.Unstructured
	for _, item := range list.Items {
		if name, _, _ := unstructured.NestedString(item.Object, "spec", "volume"); name == volume {
			records = append(records, item)
		}
	}
	return records, nil
}

// expectRecordsTokenNarrow: the token flexd's container holds lists the records, and is
// refused everything else: pods, secrets and VolumeAttachments, and records elsewhere.
func (c *Cluster) expectRecordsTokenNarrow(ctx context.Context) {
	ginkgo.GinkgoHelper()
	secret, err := c.Kube.CoreV1().Secrets(c.Namespace).Get(ctx, "flexd-controller-records", metav1.GetOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "the records token Secret")
	config := rest.AnonymousClientConfig(c.Config)
	config.BearerToken = string(secret.Data["token"])
	gomega.Expect(config.BearerToken).NotTo(gomega.BeEmpty(), "the records token")
	records, err := dynamic.NewForConfig(config)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	_, err = records.Resource(flexdRecords).Namespace(c.Namespace).List(ctx, metav1.ListOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "listing the records with the records token")
	kube, err := kubernetes.NewForConfig(config)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	refused := map[string]func() error{
		"pods": func() error {
			_, err := kube.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{})
			return err
		},
		"secrets": func() error {
			_, err := kube.CoreV1().Secrets(c.Namespace).List(ctx, metav1.ListOptions{})
			return err
		},
		"volumeattachments": func() error {
			_, err := kube.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
			return err
		},
		"records in namespace default": func() error {
			_, err := records.Resource(flexdRecords).Namespace("default").List(ctx, metav1.ListOptions{})
			return err
		},
	}
	for what, list := range refused {
		err := list()
		gomega.Expect(apierrors.IsForbidden(err)).To(gomega.BeTrue(), "listing %s with the records token: %v", what, err)
	}
}

// attacherLeader is the controller pod holding csi-attacher's leader lease for the attach
// driver, once one holds it.
func (c *Cluster) attacherLeader(ctx context.Context) string {
	ginkgo.GinkgoHelper()
	return c.leaseHolder(ctx, "csi-attacher's leader lease for "+attachCSIName, func(lease string) bool {
		return strings.Contains(lease, "attacher") && strings.HasSuffix(lease, attachCSIName)
	})
}

// leaseHolder is the Running controller replica holding the leader lease `pick` chooses by
// name, once one holds it.
func (c *Cluster) leaseHolder(ctx context.Context, what string, pick func(lease string) bool) string {
	ginkgo.GinkgoHelper()
	return c.leaseTakenOver(ctx, what, pick, nil)
}

// leaseTakenOver is the replica that took the leader lease `pick` chooses over from the
// replicas `lost`, once one has. A replica lost with its node stays Running in the API server
// until its node is found gone, so "held by a Running replica" alone does not say that the
// lease moved: and when the lost leader had finished its work before it went, nothing waited
// for the lease to move (the lease lasts 15 s past its holder's last renewal).
func (c *Cluster) leaseTakenOver(ctx context.Context, what string, pick func(lease string) bool, lost []string) string {
	ginkgo.GinkgoHelper()
	var holder string
	WaitFor(ctx, 120*time.Second, what, func(ctx context.Context) error {
		leases, err := c.Kube.CoordinationV1().Leases(c.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, lease := range leases.Items {
			if !pick(lease.Name) {
				continue
			}
			if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
				return fmt.Errorf("lease %s has no holder", lease.Name)
			}
			if slices.Contains(lost, *lease.Spec.HolderIdentity) {
				return fmt.Errorf("lease %s is still held by %s, a replica lost", lease.Name, *lease.Spec.HolderIdentity)
			}
			for _, pod := range c.ControllerPods(ctx) {
				if pod.Name == *lease.Spec.HolderIdentity {
					holder = pod.Name
					return nil
				}
			}
			return fmt.Errorf("lease %s is held by %s, no Running controller replica", lease.Name, *lease.Spec.HolderIdentity)
		}
		return fmt.Errorf("no lease in %s for %s", c.Namespace, what)
	})
	return holder
}

// killReplica deletes a controller replica at once (no grace: its processes are killed, as
// when its node is lost); the Deployment makes another.
func (c *Cluster) killReplica(ctx context.Context, pod string) {
	ginkgo.GinkgoHelper()
	err := c.Kube.CoreV1().Pods(c.Namespace).Delete(ctx, pod, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "killing controller replica %s", pod)
}
