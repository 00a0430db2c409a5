package scenarios

// fsGroup: the volume's ownership as kubelet makes it, through flexd and through kubelet's own
// FlexVolume plugin.

import (
	"context"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// scenarioFSGroup: the volume's files belong to the pod's fsGroup as kubelet's
// SetVolumeOwnership makes them (group fsGroup, group read-write, setgid directories), a
// non-root user of that group writes, and kubelet's own FlexVolume plugin makes exactly the
// same of the same driver's volume.
func scenarioFSGroup(ctx context.Context) {
	c := cluster
	const script = `id -u; id -G; stat -c "%n %g %A" /data /data/driver; echo mine > /data/mine && stat -c "%n %u %g %A" /data/mine`
	security := &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](1000), RunAsGroup: ptr.To[int64](3000), FSGroup: ptr.To[int64](2000)}

	ginkgo.By("a pod with fsGroup 2000 on a volume through flexd")
	c.StaticClaim(ctx, PersistentVolume("e2e-fsgroup", "1Gi", CSISource(c.CSIName, "e2e-fsgroup", map[string]string{"greeting": "fsgroup"})))
	throughFlexd := c.RunPod(ctx, c.ToolsPod("e2e-fsgroup", script, ClaimVolume("e2e-fsgroup"), security), 180*time.Second)
	gomega.Expect(LogLines(throughFlexd)).To(gomega.Equal([]string{
		"1000",
		"3000 2000",
		// kubelet's SetVolumeOwnership: group fsGroup, mode |= 0660, directories |= setgid 0110.
		"/data 2000 drwxrwsr-x",
		"/data/driver 2000 -rw-rw-r--",
		// The pod's user writes through the group; the setgid directory hands the group on.
		"/data/mine 1000 2000 -rw-r--r--",
	}), "the pod's identity and the volume's ownership through flexd")
	c.DeletePod(ctx, "e2e-fsgroup")

	ginkgo.By("the same through kubelet's own FlexVolume plugin")
	c.StaticClaim(ctx, PersistentVolume("e2e-fsgroup-flex", "1Gi", FlexSource(c.Driver, map[string]string{"greeting": "fsgroup"})))
	throughKubelet := c.RunPod(ctx, c.ToolsPod("e2e-fsgroup-flex", script, ClaimVolume("e2e-fsgroup-flex"), security), 180*time.Second)
	gomega.Expect(throughKubelet).To(gomega.Equal(throughFlexd), "kubelet's FlexVolume plugin and flexd differ")
	c.DeletePod(ctx, "e2e-fsgroup-flex")
}
