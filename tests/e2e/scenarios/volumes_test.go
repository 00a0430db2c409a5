package scenarios

// Volumes of the node-only driver through flexd: a static PV and a CSI ephemeral inline volume.

import (
	"context"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
)

// What a pod of the volume scenarios runs: it reads what the driver's mount wrote and writes
// back to the host directory behind the volume.
const readAndWrite = "cat /data/driver; echo written-by-pod > /data/pod"

// scenarioStaticPV: a static PV and claim of the node-only driver; the pod reads what the
// driver's mount wrote (with the PV's volumeAttributes) and writes back to the host directory;
// flexd records the publish (what a restarted flexd resumes from); the volume is unmounted and
// the record gone when the pod goes, the data kept.
func scenarioStaticPV(ctx context.Context) {
	c := cluster
	ginkgo.By("a static PV and its claim")
	c.StaticClaim(ctx, PersistentVolume("e2e-static", "1Gi",
		CSISource(c.CSIName, "e2e-static", map[string]string{"greeting": "from the static PV"})))

	ginkgo.By("a pod reading and writing the volume")
	log := c.RunPod(ctx, c.ToolsPod("e2e-static", readAndWrite, ClaimVolume("e2e-static"), nil), 180*time.Second)
	gomega.Expect(LogLines(log)).To(gomega.ContainElement("hostdir e2e-static from the static PV"), "what the driver's mount wrote")
	written := c.Path("volumes", "e2e-static", "pod")
	gomega.Expect(ReadFile(written)).To(gomega.Equal("written-by-pod\n"), "what the pod wrote, on the host")

	ginkgo.By("checking the mount and flexd's record of it")
	target := c.VolumeTarget(c.PodUID(ctx, "e2e-static"), "e2e-static")
	gomega.Expect(MountCount(target)).To(gomega.Equal(1), "mounts of %s", target)
	records := c.VolumeRecords(ctx)
	gomega.Expect(recordLines(records, target)).To(gomega.ContainElement(gomega.ContainSubstring("e2e-static")),
		"flexd's record of %s, in:\n%s", target, records)

	ginkgo.By("deleting the pod: unmounted, the record gone, the data kept")
	c.DeletePod(ctx, "e2e-static")
	c.ExpectUnpublished(ctx, target)
	gomega.Expect(ReadFile(written)).To(gomega.Equal("written-by-pod\n"), "the data after the pod")
}

// recordLines are the lines of `flexd volume list` about target.
func recordLines(records, target string) []string {
	var lines []string
	for _, line := range strings.Split(records, "\n") {
		if strings.Contains(line, target) {
			lines = append(lines, line)
		}
	}
	return lines
}

// scenarioInline: a CSI ephemeral inline volume, the options in the pod.
func scenarioInline(ctx context.Context) {
	c := cluster
	ginkgo.By("a pod with an inline volume")
	volume := InlineCSIVolume(c.CSIName, map[string]string{"volume": "e2e-inline", "greeting": "inline hello"})
	log := c.RunPod(ctx, c.ToolsPod("e2e-inline", readAndWrite, volume, nil), 180*time.Second)
	gomega.Expect(LogLines(log)).To(gomega.ContainElement("hostdir e2e-inline inline hello"), "what the driver's mount wrote")
	gomega.Expect(ReadFile(c.Path("volumes", "e2e-inline", "pod"))).To(gomega.Equal("written-by-pod\n"), "what the pod wrote, on the host")
	target := c.VolumeTarget(c.PodUID(ctx, "e2e-inline"), "data")
	gomega.Expect(MountCount(target)).To(gomega.Equal(1), "mounts of %s", target)

	ginkgo.By("deleting the pod: unmounted")
	c.DeletePod(ctx, "e2e-inline")
	WaitFor(ctx, 60*time.Second, target+" to be unmounted", notMounted(target))
}
