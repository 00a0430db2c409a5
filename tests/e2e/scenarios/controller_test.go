package scenarios

// The controller side, for a driver whose attach sets up no device (examples/drivers/attachable
// as e2e/attach): the manifests' controller runs unprivileged, and the real csi-attacher
// attaches through flexd.

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// scenarioController: the manifests' controller runs unprivileged (root with CHOWN alone, no
// /dev, no token), its non-root csi-attacher attaches through the 0660 socket, a pod writes to
// the volume (attach, then on the node mountdevice and the default bind mount), and the volume
// is detached when the pod goes.
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
	c.ControllerStatePV(ctx)
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

	ginkgo.By("the pod deleted: unmounted and detached")
	c.DeletePod(ctx, "e2e-attach")
	WaitFor(ctx, 60*time.Second, target+" to be unmounted", notMounted(target))
	WaitFor(ctx, 120*time.Second, "the VolumeAttachment of e2e-attach to go", func(ctx context.Context) error {
		attached, err := c.attachmentOf(ctx, "e2e-attach")
		if err != nil {
			return err
		}
		if attached != "" {
			return fmt.Errorf("the VolumeAttachment of e2e-attach is still there (attached: %s)", attached)
		}
		return nil
	})
	c.DeleteClaimIfThere(ctx, "e2e-attach")
	c.DeletePVIfThere(ctx, "e2e-attach")
	c.MustFlexdEverywhere(ctx, "uninstall", "--driver", attachDriver)
}
