package scenarios

// Multi-Attach (issue #35): a ReadWriteOnce loop volume in use on one node, and a second pod on
// another node using the same claim. Kubernetes' attach-detach controller refuses the second
// attach itself (its Multi-Attach event) while the first pod runs, so flexd's controller is
// never asked to attach the volume to the second node; once the first pod is gone the volume
// moves, with its data. Needs E2E_NODES >= 2.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
)

const multiAttachName = "e2e-multiattach"

// multiAttachEvent fails until the pod has the attach-detach controller's Multi-Attach event
// naming the pod that holds the volume, and returns its message through the pointer. Kubernetes
// 1.37 words it "Waiting for detach for volume … Volume is already used by pod(s) …" (its
// reportMultiAttachError; "Multi-Attach error for volume …" before).
func (c *Cluster) multiAttachEvent(pod *corev1.Pod, holder string, message *string) func(context.Context) error {
	return func(ctx context.Context) error {
		events, err := c.PodEvents(ctx, pod, "FailedAttachVolume")
		if err != nil {
			return err
		}
		for _, event := range events {
			if strings.Contains(event.Message, "Volume is already used by pod(s) "+holder) {
				*message = event.Message
				return nil
			}
		}
		return fmt.Errorf("pod %s has no Multi-Attach event naming %s (FailedAttachVolume events: %d)", pod.Name, holder, len(events))
	}
}

// scenarioMultiAttach: while pod A runs on node A, pod B on node B waits with the Multi-Attach
// event, not Ready; the volume stays attached (VolumeAttachment and the loop driver's claim) to
// A alone and one loop device, A's, backs it. Pod A deleted: pod B runs with what A wrote, the
// volume attached to B alone, one loop device, B's.
func scenarioMultiAttach(ctx context.Context) {
	c := cluster
	a, b := c.twoNodes("multiattach")
	summary := c.NewSummary("multiattach")

	ginkgo.By("flexd deployed with the builtin loop driver, on every node, and its controller")
	c.InstallLoop(ctx)
	c.ApplyAllManifests(ctx, "flexd-multiattach")
	c.WaitCSINodeLists(ctx, loopCSIName)

	ginkgo.By("a ReadWriteOnce claim of the loop driver, and a pod using it on " + a.Name)
	pv := c.ProvisionedLoopClaim(ctx, multiAttachName)
	image := filepath.Join(c.SharedDir, pv+".img")
	first := c.CreatePod(ctx, c.ToolsPodOn(a.Name, multiAttachName+"-a", `echo "written on `+a.Name+`" > /data/owner`, ClaimVolume(multiAttachName), nil))
	c.PodScriptLog(ctx, first.Name, 240*time.Second)
	WaitFor(ctx, 60*time.Second, pv+" attached to "+a.Name+" only", c.attachedOnlyTo(pv, a.Name))

	ginkgo.By("a second pod on " + b.Name + " using the same claim: the Multi-Attach event, not Ready")
	second := c.CreatePod(ctx, c.ToolsPodOn(b.Name, multiAttachName+"-b", `cat /data/owner`, ClaimVolume(multiAttachName), nil))
	var message string
	WaitFor(ctx, 120*time.Second, "the Multi-Attach event of pod "+second.Name, c.multiAttachEvent(second, first.Name, &message))
	summary.Printf("multiattach: pod %s on %s, while %s runs on %s: %s", second.Name, b.Name, first.Name, a.Name, message)
	gomega.Expect(PodReady(c.GetPod(ctx, second.Name))).To(gomega.BeFalse(), "pod %s Ready while the volume is in use on %s", second.Name, a.Name)
	// Attached to A alone: no VolumeAttachment for B, so flexd's controller was never asked.
	gomega.Expect(c.attachedOnlyTo(pv, a.Name)(ctx)).To(gomega.Succeed())
	gomega.Expect(c.loopClaimant(pv)).To(gomega.Equal(a.Name), "the loop driver's claim of %s", pv)
	gomega.Expect(c.mountedOnlyOn(image, a)(ctx)).To(gomega.Succeed())

	ginkgo.By("the first pod deleted: the second runs on " + b.Name + " with what the first wrote")
	deleted := time.Now()
	c.DeletePod(ctx, first.Name)
	log := c.PodScriptLog(ctx, second.Name, 300*time.Second)
	summary.Printf("multiattach: pod %s Ready %.0fs after %s was deleted", second.Name, time.Since(deleted).Seconds(), first.Name)
	gomega.Expect(LogLines(log)).To(gomega.ContainElement("written on "+a.Name), "what pod %s read", second.Name)
	WaitFor(ctx, 120*time.Second, pv+" attached to "+b.Name+" only", c.attachedOnlyTo(pv, b.Name))
	gomega.Expect(c.loopClaimant(pv)).To(gomega.Equal(b.Name), "the loop driver's claim of %s", pv)
	WaitFor(ctx, 60*time.Second, "one loop device backing "+image+", mounted on "+b.Name+" only", c.mountedOnlyOn(image, b))
}

// loopClaimant is the node the loop driver's claim of the volume (in the shared image dir)
// names, "" when it has none.
func (c *Cluster) loopClaimant(volume string) string {
	ginkgo.GinkgoHelper()
	claim, err := os.ReadFile(filepath.Join(c.SharedDir, "."+volume+".claim"))
	if errors.Is(err, fs.ErrNotExist) {
		return ""
	}
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "the loop driver's claim of %s", volume)
	return strings.TrimSpace(string(claim))
}
