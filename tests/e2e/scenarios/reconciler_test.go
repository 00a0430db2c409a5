package scenarios

// The reconciler (docs/oracle.md#detached-behind-kubernetes-back): a volume detached behind
// Kubernetes' back (the storage releases it while its pod runs; the driver's own detach refuses,
// as the node still mounts it) is noticed and attached again. kube-controller-manager does it for FlexVolume by calling isattached about once a
// minute for every attached volume; for CSI the external-attacher's reconciler does it from
// ListVolumes' published nodes, which flexd answers with the same isattached. Both paths side
// by side, with the builtin loop driver, whose attach claims the volume's image for one node.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
)

// loopIsAttached runs the loop driver's isattached for the volume and node by hand, as
// kube-controller-manager would.
func (c *Cluster) loopIsAttached(ctx context.Context, volume string) (bool, error) {
	options := fmt.Sprintf(`{"kubernetes.io/pvOrVolumeName":%q}`, volume)
	out, err := Run(ctx, c.Path("plugins", pluginDirName(loopDriver), "loop"), "isattached", options, c.Node)
	if err != nil {
		return false, err
	}
	var reply struct {
		Status   string `json:"status"`
		Attached bool   `json:"attached"`
	}
	if err := json.Unmarshal([]byte(out), &reply); err != nil || reply.Status != "Success" {
		return false, fmt.Errorf("isattached answered %q", out)
	}
	return reply.Attached, nil
}

// scenarioReconciler: per path, a pod on a loop volume; the loop driver's detach by hand refused,
// then the volume's claim removed behind Kubernetes' back; isattached then answers "not attached" until Kubernetes attaches it again (through
// flexd: a second ControllerPublishVolume); the pod keeps its data throughout.
func scenarioReconciler(ctx context.Context) {
	c := cluster
	summary := c.NewSummary("reconciler")

	ginkgo.By("flexd deployed with the builtin loop driver and a controller")
	c.InstallLoop(ctx)
	c.ApplyAllManifests(ctx, "flexd-reconciler")
	c.WaitCSINodeLists(ctx, loopCSIName)

	paths := map[string]string{"flexd": "e2e-reattach-csi", "kubelet": "e2e-reattach-flex"}
	// Registered first, so it runs last (after the pods, claims and PVs are gone): the images
	// and claims the loop driver made, also when the scenario fails half-way.
	ginkgo.DeferCleanup(func() {
		for _, volume := range paths {
			for _, file := range []string{volume + ".img", "." + volume + ".claim"} {
				if err := os.Remove(c.Path("loop-images", file)); err != nil && !os.IsNotExist(err) {
					ginkgo.GinkgoWriter.Printf("cleanup: %v\n", err)
				}
			}
		}
	})
	ginkgo.By("a pod per path on a static loop volume, writing to it")
	c.StaticClaim(ctx, PersistentVolume(paths["flexd"], "64Mi", CSISource(loopCSIName, paths["flexd"], map[string]string{"size": "64Mi"})))
	c.StaticClaim(ctx, PersistentVolume(paths["kubelet"], "64Mi", FlexSource(loopDriver, map[string]string{"size": "64Mi"})))
	for path, volume := range paths {
		log := c.RunPod(ctx, c.ToolsPod(volume, "echo kept-"+path+" > /data/kept; cat /data/kept", ClaimVolume(volume), nil), 240*time.Second)
		gomega.Expect(LogLines(log)).To(gomega.ContainElement("kept-" + path))
		gomega.Expect(c.loopIsAttached(ctx, volume)).To(gomega.BeTrue(), "isattached of %s for %s while its pod runs", volume, c.Node)
	}
	gomega.Expect(c.attachmentOf(ctx, paths["flexd"])).To(gomega.Equal("true"), "the VolumeAttachment of %s", paths["flexd"])
	publishesBefore := c.controllerPublishes(ctx, paths["flexd"])

	ginkgo.By("the loop driver's detach run by hand refuses: the node still mounts the volumes")
	for _, volume := range paths {
		// A refusal is a Failure reply, exit status 1.
		out, err := Run(ctx, c.Path("plugins", pluginDirName(loopDriver), "loop"), "detach", volume, c.Node)
		gomega.Expect(err).To(gomega.HaveOccurred(), "the loop driver's detach of %s while its pod mounts it answered %q", volume, out)
		gomega.Expect(out).To(gomega.ContainSubstring("still mounted"), "the loop driver's detach of %s while its pod mounts it", volume)
		gomega.Expect(c.loopIsAttached(ctx, volume)).To(gomega.BeTrue(), "isattached of %s after the refused detach", volume)
	}

	ginkgo.By("the storage releases both volumes behind Kubernetes' back (the claim removed, as a SAN unmaps a LUN)")
	detached := time.Now()
	for _, volume := range paths {
		gomega.Expect(os.Remove(c.Path("loop-images", "."+volume+".claim"))).To(gomega.Succeed(), "removing the claim of %s", volume)
		gomega.Expect(c.loopIsAttached(ctx, volume)).To(gomega.BeFalse(), "isattached of %s after its claim went", volume)
	}

	ginkgo.By("each path notices and attaches again (kube-controller-manager's check and the external-attacher's reconciler each run about once a minute)")
	reattached := map[string]time.Duration{}
	WaitFor(ctx, 240*time.Second, "both volumes attached again", func(ctx context.Context) error {
		var waiting []string
		for path, volume := range paths {
			if _, done := reattached[path]; done {
				continue
			}
			attached, err := c.loopIsAttached(ctx, volume)
			if err != nil {
				return err
			}
			if !attached {
				waiting = append(waiting, volume)
				continue
			}
			reattached[path] = time.Since(detached)
		}
		if len(waiting) > 0 {
			return fmt.Errorf("not attached again yet: %s", strings.Join(waiting, ", "))
		}
		return nil
	})
	gomega.Expect(c.controllerPublishes(ctx, paths["flexd"])).To(gomega.BeNumerically(">", publishesBefore),
		"flexd's controller ran ControllerPublishVolume for %s again", paths["flexd"])
	for _, path := range []string{"kubelet", "flexd"} {
		volume := paths[path]
		gomega.Expect(ReadFileInPod(ctx, c, volume, "/data/kept")).To(gomega.Equal("kept-"+path+"\n"), "pod %s's data after the re-attach", volume)
		summary.Printf("%s: %s attached again %.0fs after its claim went; the pod kept its data", path, volume, reattached[path].Seconds())
	}

	ginkgo.By("the pods deleted: their volumes detached")
	for _, volume := range paths {
		c.DeletePod(ctx, volume)
	}
	WaitFor(ctx, 180*time.Second, "both volumes detached", func(ctx context.Context) error {
		for _, volume := range paths {
			if attached, err := c.loopIsAttached(ctx, volume); err != nil || attached {
				return fmt.Errorf("%s still attached (%v)", volume, err)
			}
		}
		return nil
	})
	for _, volume := range paths {
		gomega.Expect(os.Remove(c.Path("loop-images", volume+".img"))).To(gomega.Succeed())
	}
}

// controllerPublishes counts the controller flexd's ControllerPublishVolume log lines for the
// volume.
func (c *Cluster) controllerPublishes(ctx context.Context, volume string) int {
	ginkgo.GinkgoHelper()
	logs := c.ControllerLogs(ctx)
	count := 0
	for _, line := range LogLines(logs) {
		if strings.Contains(line, "ControllerPublishVolume") && strings.Contains(line, volume) {
			count++
		}
	}
	return count
}
