package scenarios

// Discovery, side by side (docs/oracle.md#discovery): one driver, e2e/disco, changed in the
// plugin dir while kubelet's FlexVolume prober and flexd both watch it. After each change, a pod
// through each path (an inline flexVolume, an inline CSI volume) says which version is usable,
// if any: both must agree. The time from the change to each pod's Ready is reported (how soon
// each path noticed), never asserted.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

const (
	discoDriver = "e2e/disco"
	discoCSI    = "flexvolume-e2e--disco"
)

// discoPaths are the two paths to a driver, in the order the summary names them.
var discoPaths = []string{"kubelet", "flexd"}

// discoVersion writes run/disco-vN: the hostdir driver, its volumes' file saying "disco-vN".
func (c *Cluster) discoVersion(n int) string {
	ginkgo.GinkgoHelper()
	script := ReadFile(filepath.Join(c.Here, "drivers", "hostdir"))
	script = regexp.MustCompile(`(?m)^ROOT=.*$`).ReplaceAllLiteralString(script, "ROOT="+c.Path("volumes"))
	changed := strings.Replace(script, "printf 'hostdir %s %s", fmt.Sprintf("printf 'disco-v%d %%s %%s", n), 1)
	gomega.Expect(changed).NotTo(gomega.Equal(script), "drivers/hostdir no longer writes \"hostdir %%s %%s\" for discoVersion to change")
	path := c.Path("run", fmt.Sprintf("disco-v%d", n))
	gomega.Expect(os.WriteFile(path, []byte(changed), 0o755)).To(gomega.Succeed())
	return path
}

// discoPod is pod disco-STEP-PATH, reading the volume's file of the driver's version.
func (c *Cluster) discoPod(step, path string) *corev1.Pod {
	name := "disco-" + step + "-" + path
	volume := InlineCSIVolume(discoCSI, map[string]string{"volume": name})
	if path == "kubelet" {
		volume = InlineFlexVolume(discoDriver, map[string]string{"volume": name})
	}
	return c.ToolsPod(name, "cat /data/driver", volume, nil)
}

// createTogether creates the pods at once, each in its own request, so that neither path goes
// first; each is deleted when the scenario ends.
func (c *Cluster) createTogether(ctx context.Context, pods ...*corev1.Pod) []*corev1.Pod {
	ginkgo.GinkgoHelper()
	created := make([]*corev1.Pod, len(pods))
	errs := make([]error, len(pods))
	var wg sync.WaitGroup
	for i, pod := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			created[i], errs[i] = c.Kube.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
		}()
	}
	wg.Wait()
	for i, pod := range pods {
		if errs[i] == nil {
			ginkgo.DeferCleanup(c.DeletePodIfThere, pod.Name)
		}
	}
	for i, pod := range pods {
		gomega.Expect(errs[i]).NotTo(gomega.HaveOccurred(), "creating pod %s", pod.Name)
	}
	return created
}

// flexdNoticed is the milliseconds from changed to flexd's first log of the driver's change or
// failure, "" when it has none.
func (c *Cluster) flexdNoticed(ctx context.Context, changed time.Time) string {
	ginkgo.GinkgoHelper()
	logs, err := c.Kubectl(ctx, "-n", c.Namespace, "logs", c.NodePod(ctx).Name)
	if err != nil {
		return ""
	}
	scanner := bufio.NewScanner(strings.NewReader(logs))
	scanner.Buffer(make([]byte, 0, 1<<20), 1<<20)
	for scanner.Scan() {
		var line struct {
			Timestamp string `json:"timestamp"`
			Message   string `json:"message"`
			Driver    string `json:"driver"`
		}
		if json.Unmarshal(scanner.Bytes(), &line) != nil || line.Driver != discoDriver ||
			(line.Message != "driver changed" && line.Message != "driver failed") {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, line.Timestamp)
		if err != nil || at.Before(changed) {
			continue
		}
		return fmt.Sprint(at.Sub(changed).Milliseconds())
	}
	return ""
}

// discoStep checks which version each path has usable after a change that began at changed:
// expected is a version ("v2") or "none". It adds the step's line to the summary.
func (c *Cluster) discoStep(ctx context.Context, summary *Summary, step, expected string, changed time.Time) {
	ginkgo.GinkgoHelper()
	ginkgo.By(fmt.Sprintf("step %s: a pod through each path, expecting %s", step, expected))
	created := c.createTogether(ctx, c.discoPod(step, "kubelet"), c.discoPod(step, "flexd"))
	pods := map[string]*corev1.Pod{"kubelet": created[0], "flexd": created[1]}
	// Usable: Ready (a pod takes seconds here). Unusable: not Ready by 60 s, or with a failed
	// mount and still not Ready 15 s after the change (a usable path's early failure, e.g.
	// before flexd registered a new driver, is retried within a second or two).
	ready := map[string]time.Time{}
	deadline, settled := time.Now().Add(60*time.Second), time.Now().Add(15*time.Second)
	for time.Now().Before(deadline) && len(ready) < len(discoPaths) {
		for _, path := range discoPaths {
			if _, seen := ready[path]; seen {
				continue
			}
			pod, err := c.Kube.CoreV1().Pods(podNamespace).Get(ctx, pods[path].Name, metav1.GetOptions{})
			if err == nil && PodReady(pod) {
				ready[path] = time.Now()
			}
		}
		if !time.Now().Before(settled) && c.allFailedOrReady(ctx, pods, ready) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}

	line := "step " + step + ":"
	for _, path := range discoPaths {
		pod := pods[path]
		var verdict string
		if at, ok := ready[path]; ok {
			log := c.ScriptLog(ctx, pod.Name, 30*time.Second)
			verdict = strings.TrimPrefix(firstField(firstLine(log)), "disco-")
			line += fmt.Sprintf(" %s %s, Ready %.1fs after the change;", path, verdict, at.Sub(changed).Seconds())
		} else {
			verdict = "none"
			line += fmt.Sprintf(" %s none (%s);", path, cut(c.FailedMount(ctx, pod), 110))
		}
		if verdict != expected {
			summary.Printf("%s expected %s", line, expected)
		}
		gomega.Expect(verdict).To(gomega.Equal(expected), "step %s: the version usable through %s (%s)", step, path, line)
	}
	summary.Printf("%s flexd noticed the change after %s ms (kubelet's prober looks at its next volume operation)", line, c.flexdNoticed(ctx, changed))
	for _, path := range discoPaths {
		c.DeletePod(ctx, pods[path].Name)
	}
}

// allFailedOrReady says whether every path not Ready has a failed mount.
func (c *Cluster) allFailedOrReady(ctx context.Context, pods map[string]*corev1.Pod, ready map[string]time.Time) bool {
	for _, path := range discoPaths {
		if _, ok := ready[path]; ok {
			continue
		}
		events, err := c.PodEvents(ctx, pods[path], "FailedMount")
		if err != nil || len(events) == 0 {
			return false
		}
	}
	return true
}

// discoChange makes the change, then checks the step, timed from the change's start.
func (c *Cluster) discoChange(ctx context.Context, summary *Summary, step, expected string, change func()) {
	ginkgo.GinkgoHelper()
	changed := time.Now()
	change()
	c.discoStep(ctx, summary, step, expected, changed)
}

// scenarioDiscovery: docs/oracle.md#discovery. Both paths agree on the usable version at each
// step: installed, updated in place, a broken init, fixed, removed, recreated by hand.
func scenarioDiscovery(ctx context.Context) {
	c := cluster
	summary := c.NewSummary("discovery")
	dir := c.Path("plugins", pluginDirName(discoDriver))
	versions := map[int]string{}
	for n := 1; n <= 4; n++ {
		versions[n] = c.discoVersion(n)
	}
	broken := c.Path("run", "disco-broken")
	gomega.Expect(os.WriteFile(broken, []byte("#!/bin/sh\necho \"this is not JSON\"\n"), 0o755)).To(gomega.Succeed())
	ginkgo.DeferCleanup(func() { gomega.Expect(os.RemoveAll(dir)).To(gomega.Succeed()) })

	ginkgo.By("the CSIDriver object an operator applies once per driver (flexd manifests prints it)")
	csidriver := &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: discoCSI},
		Spec: storagev1.CSIDriverSpec{
			AttachRequired:       ptr.To(false),
			PodInfoOnMount:       ptr.To(true),
			FSGroupPolicy:        ptr.To(storagev1.FileFSGroupPolicy),
			VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral},
		},
	}
	_, err := c.Kube.StorageV1().CSIDrivers().Create(ctx, csidriver, metav1.CreateOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "creating the CSIDriver %s", discoCSI)
	ginkgo.DeferCleanup(func(ctx context.Context) {
		err := c.Kube.StorageV1().CSIDrivers().Delete(ctx, discoCSI, metav1.DeleteOptions{})
		if !apierrors.IsNotFound(err) {
			gomega.Expect(err).NotTo(gomega.HaveOccurred(), "deleting the CSIDriver %s", discoCSI)
		}
	})

	install := func(executable string) func() {
		return func() { c.MustFlexd(ctx, "install", "--driver", discoDriver, executable) }
	}
	c.discoChange(ctx, summary, "installed", "v1", install(versions[1]))
	c.discoChange(ctx, summary, "updated-in-place", "v2", install(versions[2]))
	c.discoChange(ctx, summary, "broken-init", "none", install(broken))
	c.discoChange(ctx, summary, "fixed", "v3", install(versions[3]))
	c.discoChange(ctx, summary, "removed", "none", func() { gomega.Expect(os.RemoveAll(dir)).To(gomega.Succeed()) })
	// By hand, not atomically: the directory, then the executable copied into it.
	c.discoChange(ctx, summary, "recreated-by-hand", "v4", func() {
		MustRun(ctx, "mkdir", dir)
		MustRun(ctx, "cp", versions[4], filepath.Join(dir, "disco"))
	})
}

// firstField is a line's first field (awk's $1), "" when it has none.
func firstField(line string) string {
	if fields := strings.Fields(line); len(fields) > 0 {
		return fields[0]
	}
	return ""
}
