package scenarios

// flexd rolled from one build to the next, as docs/operator-guide.md#upgrade-flexd says: the
// manifests applied again with the new image, under pods that keep writing to mounted volumes
// of both shapes (a node-only driver, bind-mounted; an attachable, provisioned loop volume with
// a staged ext4), while a new volume is provisioned and attached.
//
// The two builds: the previous one is the flexd the tests built, packed by cluster.sh
// (E2E_FLEXD_PREVIOUS_IMAGE); the next is the image built from deploy/Dockerfile
// (E2E_FLEXD_IMAGE), the one every other scenario runs. Their binaries differ (a debug and a
// release build) though their source is the same commit.

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
)

const (
	rolloutWritePeriod = "0.2"
	rolloutClass       = "flexd-rollout"
)

// rolloutWriter is a pod that appends "<n> <uptime>" to /data/writes every 0.2 s, in the
// background, and says FAILED on its log for a write that fails.
func (c *Cluster) rolloutWriter(name string, volume corev1.VolumeSource) *corev1.Pod {
	script := `(i=0; while :; do i=$((i + 1));
  echo "$i $(cut -d' ' -f1 /proc/uptime)" >>/data/writes 2>/tmp/error || echo "FAILED write $i: $(cat /tmp/error)";
  sleep ` + rolloutWritePeriod + `; done) &`
	return c.ToolsPod(name, script, volume, nil)
}

// rolloutWrites are a writer's writes so far: their uptimes, in order. Fails unless they are
// numbered 1, 2, 3, ... with none missing.
func (c *Cluster) rolloutWrites(ctx context.Context, pod string) []float64 {
	ginkgo.GinkgoHelper()
	out := c.MustKubectl(ctx, "-n", podNamespace, "exec", pod, "--", "cat", "/data/writes")
	var uptimes []float64
	for i, line := range LogLines(out) {
		fields := strings.Fields(line)
		gomega.Expect(fields).To(gomega.HaveLen(2), "%s's write %d: %q", pod, i+1, line)
		gomega.Expect(fields[0]).To(gomega.Equal(strconv.Itoa(i+1)), "%s's writes are not 1, 2, 3, ...: a write lost", pod)
		uptime, err := strconv.ParseFloat(fields[1], 64)
		gomega.Expect(err).NotTo(gomega.HaveOccurred(), "%s's write %d: %q", pod, i+1, line)
		uptimes = append(uptimes, uptime)
	}
	return uptimes
}

// mountID is the kernel's id of the mount at path on the host: a remount, or an unmount and
// mount again, gives a new one.
func mountID(path string) string {
	ginkgo.GinkgoHelper()
	for _, mount := range readMountinfo("/proc/self/mountinfo") {
		if mount.Target == path {
			return mount.ID
		}
	}
	ginkgo.Fail(path + " is not mounted")
	return ""
}

// applyFlexdImage applies the manifests for every installed driver with flexd's image set to
// image, not waiting for the rollout it starts.
func (c *Cluster) applyFlexdImage(ctx context.Context, name, image string) {
	ginkgo.GinkgoHelper()
	current := c.FlexdImage
	c.FlexdImage = image
	defer func() { c.FlexdImage = current }()
	c.applyManifestsNoWait(ctx, name, c.SidecarImageFlags...)
}

// waitFlexdRolledOut waits until flexd's node DaemonSet and controller Deployment run image
// alone, every pod of them ready.
func (c *Cluster) waitFlexdRolledOut(ctx context.Context, image string) {
	ginkgo.GinkgoHelper()
	c.MustKubectl(ctx, "-n", c.Namespace, "rollout", "status", "daemonset/flexd-node", "--timeout=300s")
	c.MustKubectl(ctx, "-n", c.Namespace, "rollout", "status", "deployment/flexd-controller", "--timeout=300s")
	for _, node := range c.Nodes {
		pod := c.NodePodOn(ctx, node.Name)
		gomega.Expect(pod.Spec.Containers[0].Image).To(gomega.Equal(image), "flexd's node pod on %s", node.Name)
	}
	for _, pod := range c.ControllerPods(ctx) {
		gomega.Expect(pod.Spec.Containers[0].Image).To(gomega.Equal(image), "controller pod %s", pod.Name)
	}
}

// rolloutPause is the longest time between two writes of a writer, and when it began.
func rolloutPause(uptimes []float64) (longest, at float64) {
	for i := 1; i < len(uptimes); i++ {
		if gap := uptimes[i] - uptimes[i-1]; gap > longest {
			longest, at = gap, uptimes[i-1]
		}
	}
	return longest, at
}

// scenarioRollout: flexd's node pods and controller replicas replaced by the next build under
// two writing pods: no write fails or is lost, neither volume is unmounted or mounted again, a
// volume provisioned and attached while flexd rolls mounts, and after the rollout attach,
// detach, provisioning and deletion work.
func scenarioRollout(ctx context.Context) {
	c := cluster
	summary := c.NewSummary("rollout")
	c.InstallLoop(ctx)

	ginkgo.By("flexd at the previous build (" + c.FlexdPreviousImage + ") for every installed driver")
	c.applyFlexdImage(ctx, "flexd-rollout-previous", c.FlexdPreviousImage)
	// Whatever happens, the suite goes on with the image it deployed.
	ginkgo.DeferCleanup(func(ctx context.Context) {
		c.ApplyAllManifests(ctx, "flexd-rollout-restore")
	})
	c.waitFlexdRolledOut(ctx, c.FlexdPreviousImage)
	previous := c.MustKubectl(ctx, "-n", c.Namespace, "exec", c.NodePod(ctx).Name, "-c", "flexd", "--", "flexd", "--version")

	ginkgo.By("two pods writing every " + rolloutWritePeriod + " s: one on the node-only driver, one on a provisioned loop volume")
	hostdir := c.CreatePod(ctx, c.rolloutWriter("e2e-rollout-hostdir", InlineCSIVolume(c.CSIName, map[string]string{"volume": "e2e-rollout"})))
	loopPV := c.ProvisionedLoopClaim(ctx, rolloutClass)
	loop := c.CreatePod(ctx, c.rolloutWriter("e2e-rollout-loop", ClaimVolume(rolloutClass)))
	c.WaitPodReady(ctx, hostdir.Name, 180*time.Second)
	c.WaitPodReady(ctx, loop.Name, 180*time.Second)
	targets := map[string]string{
		hostdir.Name: c.VolumeTarget(c.PodUID(ctx, hostdir.Name), "data"),
		loop.Name:    c.VolumeTarget(c.PodUID(ctx, loop.Name), loopPV),
	}
	WaitFor(ctx, 60*time.Second, "ten writes of each writer", func(ctx context.Context) error {
		for pod := range targets {
			if n := len(c.rolloutWrites(ctx, pod)); n < 10 {
				return fmt.Errorf("%s wrote %d times", pod, n)
			}
		}
		return nil
	})
	mountIDs := map[string]string{}
	for pod, target := range targets {
		mountIDs[pod] = mountID(target)
	}
	nodePodBefore := c.NodePodState(ctx)

	ginkgo.By("the manifests applied again with the next build (" + c.FlexdImage + ")")
	rollStart := c.uptime()
	c.applyFlexdImage(ctx, "flexd-rollout-next", c.FlexdImage)

	ginkgo.By("a volume provisioned and attached while flexd rolls")
	duringPV := c.ProvisionedLoopClaim(ctx, rolloutClass+"-during")
	during := c.RunPod(ctx, c.ToolsPod("e2e-rollout-during", "echo during > /data/file; cat /data/file", ClaimVolume(rolloutClass+"-during"), nil), 300*time.Second)
	gomega.Expect(LogLines(during)).To(gomega.Equal([]string{"during"}))

	ginkgo.By("waiting for the rollout to end")
	c.waitFlexdRolledOut(ctx, c.FlexdImage)
	rollEnd := c.uptime()
	gomega.Expect(c.NodePodState(ctx).UID).NotTo(gomega.Equal(nodePodBefore.UID), "flexd's node pod was not replaced")
	next := c.MustKubectl(ctx, "-n", c.Namespace, "exec", c.NodePod(ctx).Name, "-c", "flexd", "--", "flexd", "--version")
	summary.Printf("rolled from %s (%s) to %s (%s) in %.1f s", c.FlexdPreviousImage, strings.TrimSpace(previous), c.FlexdImage, strings.TrimSpace(next), rollEnd-rollStart)

	ginkgo.By("every write kept, none failed, both volumes mounted as they were")
	// Two more writes each, after the rollout: the writers went on.
	time.Sleep(time.Second)
	for pod, target := range targets {
		log := c.MustKubectl(ctx, "-n", podNamespace, "logs", pod)
		gomega.Expect(log).NotTo(gomega.ContainSubstring("FAILED"), "%s's writes", pod)
		uptimes := c.rolloutWrites(ctx, pod)
		gomega.Expect(uptimes[len(uptimes)-1]).To(gomega.BeNumerically(">", rollEnd), "%s wrote nothing after the rollout", pod)
		gomega.Expect(mountID(target)).To(gomega.Equal(mountIDs[pod]), "%s's volume was mounted again", pod)
		gomega.Expect(MountCount(target)).To(gomega.Equal(1), "mounts of %s", target)
		var during []float64
		for _, at := range uptimes {
			if at >= rollStart && at <= rollEnd {
				during = append(during, at)
			}
		}
		longest, at := rolloutPause(uptimes)
		summary.Printf("%s: %d writes, %d during the rollout; longest pause between two writes %.2f s (at %+.1f s of the rollout)",
			pod, len(uptimes), len(during), longest, at-rollStart)
	}

	ginkgo.By("after the rollout: the volume provisioned during it detached and deleted, a new one attached")
	c.DeletePod(ctx, "e2e-rollout-during")
	c.waitDetached(ctx, duringPV, 180*time.Second)
	after := c.RunPod(ctx, c.ToolsPod("e2e-rollout-after", "cat /data/file", ClaimVolume(rolloutClass+"-during"), nil), 180*time.Second)
	gomega.Expect(LogLines(after)).To(gomega.Equal([]string{"during"}), "the volume provisioned during the rollout, attached again")
	c.DeletePod(ctx, "e2e-rollout-after")
	c.DeletePod(ctx, loop.Name)
	c.waitDetached(ctx, loopPV, 180*time.Second)
}

// uptime is the host's uptime in seconds, the clock the writers stamp their writes with (the
// pods share the host's kernel).
func (c *Cluster) uptime() float64 {
	ginkgo.GinkgoHelper()
	data, err := os.ReadFile("/proc/uptime")
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	uptime, err := strconv.ParseFloat(strings.Fields(string(data))[0], 64)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	return uptime
}
