package scenarios

// kubelet as the oracle (docs/oracle.md says what is compared and lists every difference). The
// same drivers, behind a recording wrapper (cmd/recorder), serve the same volumes twice: once
// through kubelet's and kube-controller-manager's own FlexVolume plugin, once through flexd
// after `flexd migrate`. The call-outs each driver saw are then compared record by record
// (oracle.jq, run with jq as before), paths and pod UIDs normalised in one place there. Beside
// it, where kubelet is known to fail (docs/oracle.md#where-kubelet-fails).

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

const (
	oracleHostdir = "e2e/rec-hostdir" // the hostdir driver behind the recorder: node-only
	oracleLoop    = "e2e/rec-loop"    // flexd's builtin loop driver behind the recorder: attaches
	oraclePod     = "oracle"
	oracleSecret  = "oracle-secret"
	// The report's last line when every difference is one docs/oracle.md lists.
	oracleClean = "oracle: 0 differences not listed in docs/oracle.md"
)

// oracleDir holds the records: under the loop driver's image dir, which flexd's manifests mount
// at its host path in both of flexd's pods (the controller's runs attach and detach in its own
// container).
func (c *Cluster) oracleDir() string { return c.Path("loop-images", "oracle") }

// oracleInstall installs the recorder as driver name in front of the executable real, on every
// node (the controller pod, wherever it runs, reads its own node's plugin dir; real is at the
// same path on every node, or relative to the recorder's dir: see oracleLoopReal); it records
// into records, a file in oracleDir.
func (c *Cluster) oracleInstall(ctx context.Context, name, real, records string) {
	ginkgo.GinkgoHelper()
	config, err := json.Marshal(map[string]string{"exec": real, "log": filepath.Join(c.oracleDir(), records)})
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	for _, node := range c.Nodes {
		dir := node.Path("plugins", pluginDirName(name))
		gomega.Expect(os.MkdirAll(dir, 0o755)).To(gomega.Succeed())
		gomega.Expect(os.WriteFile(filepath.Join(dir, "recorder.json"), config, 0o644)).To(gomega.Succeed())
		_, err := c.FlexdOn(ctx, node, "install", "--driver", name, c.Path("bin", "recorder"))
		gomega.Expect(err).NotTo(gomega.HaveOccurred(), "installing %s on %s", name, node.Name)
	}
}

// oracleLoopReal is the loop driver behind the recorder: beside it in the plugin dir, by a path
// relative to it, which resolves on the host (`flexd migrate` asks the driver's init), on the
// nodes and in flexd's controller pod, whichever path each has the plugin dir at
// (KubeletPluginDir but on the host).
var oracleLoopReal = filepath.Join("..", pluginDirName(loopDriver), "loop")

// oracleObjects are the FlexVolume objects: the Secret, two PVs and their claims, Bound.
func (c *Cluster) oracleObjects(ctx context.Context) {
	ginkgo.GinkgoHelper()
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: oracleSecret, Namespace: podNamespace},
		// FlexVolume reads only a Secret whose type is the driver's name.
		Type:       corev1.SecretType(oracleHostdir),
		StringData: map[string]string{"password": "not-a-real-secret", "user": "oracle"},
	}
	_, err := c.Kube.CoreV1().Secrets(podNamespace).Create(ctx, secret, metav1.CreateOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "creating the Secret %s", oracleSecret)
	ginkgo.DeferCleanup(func(ctx context.Context) {
		err := c.Kube.CoreV1().Secrets(podNamespace).Delete(ctx, oracleSecret, metav1.DeleteOptions{})
		if !apierrors.IsNotFound(err) {
			gomega.Expect(err).NotTo(gomega.HaveOccurred(), "deleting the Secret %s", oracleSecret)
		}
	})

	hostdir := FlexSource(oracleHostdir, map[string]string{"volume": "oracle-hostdir", "greeting": "from a PV"})
	hostdir.FlexVolume.SecretRef = &corev1.SecretReference{Name: oracleSecret, Namespace: podNamespace}
	c.StaticClaim(ctx, PersistentVolume("oracle-hostdir", "1Gi", hostdir))
	loop := FlexSource(oracleLoop, map[string]string{"size": "64Mi"})
	loop.FlexVolume.FSType = "ext4"
	c.StaticClaim(ctx, PersistentVolume("oracle-loop", "64Mi", loop))
}

// oraclePodYAML is the pod, as FlexVolume knew it, as YAML for `flexd migrate -f`: both claims,
// and an inline read-only volume with the secret; an fsGroup and a non-root user, so ownership
// is applied.
func (c *Cluster) oraclePodYAML() string {
	ginkgo.GinkgoHelper()
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: oraclePod, Namespace: podNamespace},
		Spec: corev1.PodSpec{
			// On node 0, as ToolsPod: the recorders are in its plugin dir.
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": c.Node},
			HostNetwork:                   true,
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			SecurityContext:               &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](1000), RunAsGroup: ptr.To[int64](3000), FSGroup: ptr.To[int64](2000)},
			Containers: []corev1.Container{{
				Name:            "main",
				Image:           c.ToolsImage,
				ImagePullPolicy: corev1.PullNever,
				Command: []string{"/bin/sh", "-c",
					`cat /pv/driver /inline/driver; stat -c "%n %g %A" /pv /loop; echo $1 > /loop/$1; ls /loop; echo DONE; exec sleep 3600`, "sh"},
				Args: []string{"written"},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "pv", MountPath: "/pv"},
					{Name: "loop", MountPath: "/loop"},
					{Name: "inline", MountPath: "/inline", ReadOnly: true},
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "pv", VolumeSource: ClaimVolume("oracle-hostdir")},
				{Name: "loop", VolumeSource: ClaimVolume("oracle-loop")},
				{Name: "inline", VolumeSource: corev1.VolumeSource{FlexVolume: &corev1.FlexVolumeSource{
					Driver:    oracleHostdir,
					ReadOnly:  true,
					Options:   map[string]string{"volume": "oracle-inline", "greeting": "inline"},
					SecretRef: &corev1.LocalObjectReference{Name: oracleSecret},
				}}},
			},
		},
	}
	manifest, err := yaml.Marshal(pod)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	return c.WriteRun("oracle-pod.yaml", string(manifest))
}

// oracleRun runs the pod of the manifest as an operator creates it: up, its reads done, then
// gone with everything unmounted and detached. It returns the pod's log (run/oracle-LABEL.log).
func (c *Cluster) oracleRun(ctx context.Context, label, manifest string) string {
	ginkgo.GinkgoHelper()
	c.MustKubectl(ctx, "create", "-f", manifest)
	ginkgo.DeferCleanup(c.DeletePodIfThere, oraclePod)
	log := c.PodScriptLog(ctx, oraclePod, 240*time.Second)
	c.WriteRun("oracle-"+label+".log", log)
	c.DeletePod(ctx, oraclePod)
	WaitFor(ctx, 120*time.Second, "no volume of "+oraclePod+" mounted", oracleUnmounted)
	WaitFor(ctx, 180*time.Second, "every volume detached", c.noAttachments)
	return log
}

// The oracle's volumes' mounts: the pod's, the device mounts of the loop volume.
var oracleMount = regexp.MustCompile(`oracle-(hostdir|loop|inline)|/oracle/`)

func oracleUnmounted(context.Context) error {
	var left []string
	for _, target := range Mounts() {
		if oracleMount.MatchString(target) {
			left = append(left, target)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("still mounted: %s", strings.Join(left, ", "))
	}
	return nil
}

// noAttachments fails while the node lists an attached volume or there is a VolumeAttachment.
func (c *Cluster) noAttachments(ctx context.Context) error {
	node, err := c.Kube.CoreV1().Nodes().Get(ctx, c.Node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if len(node.Status.VolumesAttached) > 0 {
		return fmt.Errorf("node %s lists attached volumes %v", c.Node, node.Status.VolumesAttached)
	}
	attachments, err := c.Kube.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	if len(attachments.Items) > 0 {
		var names []string
		for _, a := range attachments.Items {
			names = append(names, a.Name)
		}
		return fmt.Errorf("VolumeAttachments left: %s", strings.Join(names, ", "))
	}
	return nil
}

// oracleCompare runs oracle.jq on the records and adds its report to the summary; it fails on a
// difference docs/oracle.md does not list.
func (c *Cluster) oracleCompare(ctx context.Context, summary *Summary, records string) {
	ginkgo.GinkgoHelper()
	records = c.oracleNode0Records(summary, records)
	report := MustRun(ctx, "jq", "-n", "-r", "--slurpfile", "records", records, "--arg", "root", c.Dir, "-f", filepath.Join(c.Here, "oracle.jq"))
	summary.Printf("%s", report)
	lines := LogLines(report)
	gomega.Expect(lines[len(lines)-1]).To(gomega.Equal(oracleClean), "the oracle's comparison (report above and in logs/scenario-oracle.summary):\n%s", report)
}

// scenarioOracle: docs/oracle.md. The pod of three FlexVolume volumes through kubelet's own
// FlexVolume plugin, then, after the cut-over and `flexd migrate`, through flexd: it must see the
// same files, owners and modes, and every call-out difference must be one docs/oracle.md lists.
// Then where kubelet is known to fail, in pods started first so their 2 minutes pass meanwhile.
func scenarioOracle(ctx context.Context) {
	c := cluster
	summary := c.NewSummary("oracle")

	ginkgo.By("installing the recorders in front of the hostdir and loop drivers")
	c.InstallLoop(ctx)
	gomega.Expect(os.MkdirAll(c.oracleDir(), 0o755)).To(gomega.Succeed())
	old, err := filepath.Glob(filepath.Join(c.oracleDir(), "*.jsonl"))
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	for _, file := range old {
		gomega.Expect(os.Remove(file)).To(gomega.Succeed())
	}
	c.oracleInstall(ctx, oracleHostdir, c.Path("run", "hostdir"), "records.jsonl")
	c.oracleInstall(ctx, oracleLoop, oracleLoopReal, "records.jsonl")

	ginkgo.By("applying flexd's manifests for every installed driver, with the controller")
	c.ApplyAllManifests(ctx, "flexd-oracle")

	ginkgo.By("starting the pods of where kubelet fails (a chatty and a hanging mount, each both ways)")
	quirks := c.quirkPods(ctx)

	ginkgo.By("the FlexVolume objects: the Secret, two PVs and their claims")
	c.oracleObjects(ctx)
	podYAML := c.oraclePodYAML()

	ginkgo.By("the pod through kubelet's own FlexVolume plugin (and kube-controller-manager's for attach)")
	throughKubelet := c.oracleRun(ctx, "kubelet", podYAML)
	// The cut-over waits for kube-controller-manager's detach itself, not the node's status:
	// the status drops the volume first. And the detach must come: a loop driver whose
	// isattached answered "not attached" once unmountdevice released the loop device made
	// kube-controller-manager's minute check mark the volume detached without ever running
	// detach (a CI run's failure; the loop driver's claim fixed it, docs/oracle.md#isattached).
	WaitFor(ctx, 240*time.Second, "kube-controller-manager's detach of oracle-loop", c.controllerManagerDetached)

	ginkgo.By("the cut-over: `flexd migrate --apply` of the PVs (docs/migration.md#apply), `flexd migrate -f` of the pod")
	ginkgo.DeferCleanup(c.deleteMigrationJournal)
	c.MustFlexd(ctx, "migrate", "--apply", "--pv", "oracle-hostdir", "--pv", "oracle-loop", "--yes",
		"--kubeconfig", c.Path("kubeconfig"), "--journal-namespace", c.Namespace)
	migratedPod := c.WriteRun("oracle-pod-csi.yaml", c.MustFlexd(ctx, "migrate", "-f", podYAML))
	c.WaitClaimBound(ctx, "oracle-hostdir", 120*time.Second)
	c.WaitClaimBound(ctx, "oracle-loop", 120*time.Second)

	ginkgo.By("the same pod, migrated, through flexd")
	throughFlexd := c.oracleRun(ctx, "flexd", migratedPod)

	ginkgo.By("comparing what the pod saw both times (its own file's name aside)")
	gomega.Expect(strings.ReplaceAll(throughFlexd, "written", "")).To(gomega.Equal(strings.ReplaceAll(throughKubelet, "written", "")),
		"the pod saw different volumes through flexd (run/oracle-flexd.log) than through kubelet (run/oracle-kubelet.log)")

	ginkgo.By("comparing the call-outs (oracle.jq)")
	c.oracleCompare(ctx, summary, filepath.Join(c.oracleDir(), "records.jsonl"))

	c.whereKubeletFails(ctx, summary, quirks)
}

// --- where kubelet is known to fail (docs/oracle.md#where-kubelet-fails) ----------------------
// The hostdir driver's quirk option, through kubelet's FlexVolume plugin (an inline flexVolume)
// and through flexd (an inline CSI volume), in the same cluster at the same time.

// quirkPods are the pods oracle-QUIRK-PATH, and when they started.
type quirkPods struct {
	pods    map[string]*corev1.Pod
	started time.Time
}

// quirkVolume is the volume of pod oracle-QUIRK-PATH.
func (c *Cluster) quirkVolume(path, quirk string) corev1.VolumeSource {
	volume := "oracle-" + quirk + "-" + path
	if path == "kubelet" {
		return InlineFlexVolume(c.Driver, map[string]string{"volume": volume, "quirk": quirk})
	}
	return InlineCSIVolume(c.CSIName, map[string]string{"volume": volume, "quirk": quirk})
}

// quirkPods starts them before the comparison, so the hanging mounts' 2 minutes pass meanwhile.
func (c *Cluster) quirkPods(ctx context.Context) quirkPods {
	ginkgo.GinkgoHelper()
	q := quirkPods{pods: map[string]*corev1.Pod{}, started: time.Now()}
	for _, path := range []string{"kubelet", "flexd"} {
		chatty := c.ToolsPod("oracle-chatty-"+path, `stat -c "group %g" /data`, c.quirkVolume(path, "chatty"),
			&corev1.PodSecurityContext{FSGroup: ptr.To[int64](2000)})
		q.pods[chatty.Name] = c.CreatePod(ctx, chatty)
		hang := c.ToolsPod("oracle-hang-"+path, "cat /data/driver", c.quirkVolume(path, "hang"), nil)
		q.pods[hang.Name] = c.CreatePod(ctx, hang)
	}
	// Before the pods' own cleanups (last in, first out): a hanging mount keeps its pod until
	// its driver is killed, by hand for kubelet's.
	ginkgo.DeferCleanup(c.endHangPods)
	return q
}

// hungDrivers are the processes of the hostdir driver's mount for pod oracle-hang-PATH of this
// cluster, oldest first: kubelet and flexd run it by kubelet's plugin dir (KubeletPluginDir) in
// node 0's network namespace, which the scenarios run in too (another cluster on the host, even
// one given the same E2E_PLUGIN_DIR, has its own).
func (c *Cluster) hungDrivers(path string) []int {
	pattern := regexp.MustCompile(regexp.QuoteMeta(c.KubeletPluginDir) + `/\S*hostdir mount .*oracle-hang-` + path)
	ownNet, _ := os.Readlink("/proc/self/ns/net")
	type proc struct {
		pid   int
		start uint64
	}
	var found []proc
	entries, _ := os.ReadDir("/proc")
	for _, entry := range entries {
		pid, err := strconv.Atoi(entry.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", entry.Name(), "cmdline"))
		if err != nil || !pattern.Match(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})) {
			continue
		}
		if net, _ := os.Readlink(filepath.Join("/proc", entry.Name(), "ns", "net")); net != ownNet {
			continue
		}
		found = append(found, proc{pid, processStart(pid)})
	}
	// Oldest first: what pgrep -o picks is the first.
	slices.SortFunc(found, func(a, b proc) int { return cmp.Compare(a.start, b.start) })
	pids := make([]int, len(found))
	for i, p := range found {
		pids[i] = p.pid
	}
	return pids
}

// processStart is a process's start time (clock ticks since boot), 0 when it is gone.
func processStart(pid int) uint64 {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// After the command's closing parenthesis: state is field 3, starttime field 22.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(fields) < 20 {
		return 0
	}
	start, _ := strconv.ParseUint(fields[19], 10, 64)
	return start
}

// running says whether the process is there (kill -0).
func running(pid int) bool { return syscall.Kill(pid, 0) == nil }

// processAge is the process's elapsed time in seconds, as ps says it.
func processAge(ctx context.Context, pid int) string {
	out, err := Run(ctx, "ps", "-o", "etimes=", "-p", strconv.Itoa(pid))
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(out)
}

// killHungDrivers kills the hanging mounts of this cluster's hang pods, both paths.
func (c *Cluster) killHungDrivers() {
	for _, path := range []string{"kubelet", "flexd"} {
		for _, pid := range c.hungDrivers(path) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// endHangPods is the cleanup of the hang pods: deleted, their drivers killed until they go (the
// driver of a retried mount too).
func (c *Cluster) endHangPods(ctx context.Context) {
	for _, name := range []string{"oracle-hang-kubelet", "oracle-hang-flexd"} {
		err := c.Kube.CoreV1().Pods(podNamespace).Delete(ctx, name, metav1.DeleteOptions{})
		if !apierrors.IsNotFound(err) {
			gomega.Expect(err).NotTo(gomega.HaveOccurred(), "deleting pod %s", name)
		}
	}
	WaitFor(ctx, 180*time.Second, "the hang pods to go", func(ctx context.Context) error {
		c.killHungDrivers()
		pods, err := c.Kube.CoreV1().Pods(podNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, pod := range pods.Items {
			if strings.HasPrefix(pod.Name, "oracle-hang-") {
				return fmt.Errorf("pod %s is still there", pod.Name)
			}
		}
		return nil
	})
}

// hungDriver fails until the mount of pod oracle-hang-PATH runs.
func (c *Cluster) hungDriver(path string) func(context.Context) error {
	return func(context.Context) error {
		if len(c.hungDrivers(path)) == 0 {
			return fmt.Errorf("no process of the hostdir driver's mount for oracle-hang-%s", path)
		}
		return nil
	}
}

// volumeManagerTimeout is how kubelet's volume manager says it stopped waiting for a pod's
// volumes (kubelet's syncPod, after 2m3s): not an answer of the volume's plugin.
var volumeManagerTimeout = regexp.MustCompile(`^Unable to attach or mount volumes: .*timed out waiting`)

// mountAnswers are the pod's FailedMount messages that came from a finished mount call, the
// volume manager's own time-outs left out.
func (c *Cluster) mountAnswers(ctx context.Context, pod *corev1.Pod) []string {
	ginkgo.GinkgoHelper()
	events, err := c.PodEvents(ctx, pod, "FailedMount")
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "the FailedMount events of pod %s", pod.Name)
	var answers []string
	for _, event := range events {
		if !volumeManagerTimeout.MatchString(event.Message) {
			answers = append(answers, event.Message)
		}
	}
	return answers
}

// failedMountSays fails until the pod's last FailedMount event matches.
func (c *Cluster) failedMountSays(pod *corev1.Pod, want *regexp.Regexp) func(context.Context) error {
	return func(ctx context.Context) error {
		events, err := c.PodEvents(ctx, pod, "FailedMount")
		if err != nil {
			return err
		}
		if len(events) == 0 {
			return fmt.Errorf("pod %s has no FailedMount event", pod.Name)
		}
		if last := events[len(events)-1].Message; !want.MatchString(last) {
			return fmt.Errorf("pod %s's last FailedMount says %q, not /%s/", pod.Name, last, want)
		}
		return nil
	}
}

// firstFailedMountAfter is the seconds from the pod's creation to its first FailedMount event.
func (c *Cluster) firstFailedMountAfter(ctx context.Context, pod *corev1.Pod) int64 {
	ginkgo.GinkgoHelper()
	events, err := c.PodEvents(ctx, pod, "FailedMount")
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	gomega.Expect(events).NotTo(gomega.BeEmpty(), "pod %s's FailedMount events", pod.Name)
	var first int64 = -1
	for _, event := range events {
		at := event.FirstTimestamp.Unix()
		if event.FirstTimestamp.IsZero() {
			at = event.EventTime.Unix()
		}
		if first < 0 || at < first {
			first = at
		}
	}
	return first - pod.CreationTimestamp.Unix()
}

func (c *Cluster) whereKubeletFails(ctx context.Context, summary *Summary, q quirkPods) {
	ginkgo.GinkgoHelper()
	// A log line before the JSON: kubelet cannot parse the reply and fails SetUp, but the driver
	// did mount; kubelet's retry finds the dir mounted and returns early, skipping the fsGroup
	// ownership. flexd reads the JSON after the line: no failure, ownership applied.
	ginkgo.By("where kubelet fails: a driver that logs a line before its JSON")
	chattyFlexd, chattyKubelet := q.pods["oracle-chatty-flexd"], q.pods["oracle-chatty-kubelet"]
	flexdLog := c.PodScriptLog(ctx, chattyFlexd.Name, 120*time.Second)
	gomega.Expect(LogLines(flexdLog)).To(gomega.ContainElement("group 2000"), "the fsGroup of /data through flexd")
	gomega.Expect(c.FailedMount(ctx, chattyFlexd)).To(gomega.BeEmpty(), "flexd failed a mount of the chatty driver")
	WaitFor(ctx, 120*time.Second, "kubelet's FailedMount for oracle-chatty-kubelet saying 'invalid character'",
		c.failedMountSays(chattyKubelet, regexp.MustCompile(`invalid character`)))
	kubeletLog := c.PodScriptLog(ctx, chattyKubelet.Name, 180*time.Second)
	gomega.Expect(LogLines(kubeletLog)).NotTo(gomega.ContainElement("group 2000"), "kubelet applied fsGroup after all")
	summary.Printf("where kubelet fails: a driver that logs a line before its JSON (the pod has fsGroup 2000)")
	summary.Printf("  kubelet: SetUp fails (%s); the retry finds the mount the driver made and skips ownership: /data %s",
		cut(c.FailedMount(ctx, chattyKubelet), 120), firstLine(kubeletLog))
	summary.Printf("  flexd:   Ready, no FailedMount, /data %s", firstLine(flexdLog))

	// A mount that never returns (Kubernetes #31272), in both pods since the start.
	ginkgo.By("where kubelet fails: a driver whose mount never returns")
	hangKubelet, hangFlexd := q.pods["oracle-hang-kubelet"], q.pods["oracle-hang-flexd"]
	WaitFor(ctx, 60*time.Second, "the kubelet path's hanging mount", c.hungDriver("kubelet"))
	WaitFor(ctx, 60*time.Second, "the flexd path's hanging mount", c.hungDriver("flexd"))
	kubeletDriver, flexdDriver := c.hungDrivers("kubelet")[0], c.hungDrivers("flexd")[0]
	// flexd kills the driver at its call-out timeout (2 min); kubelet's CSI call ends at its own
	// deadline (also 2 min) and is retried.
	WaitFor(ctx, 300*time.Second, "a FailedMount for oracle-hang-flexd", c.failedMountSays(hangFlexd, regexp.MustCompile(`.`)))
	answered := c.firstFailedMountAfter(ctx, hangFlexd)
	// kubelet's deadline and flexd's timeout are both 2 min: the FailedMount may come from the
	// first a moment before flexd kills the driver (with its kill grace) at the second.
	WaitFor(ctx, 60*time.Second, fmt.Sprintf("flexd to kill its hanging driver (pid %d) at its call-out timeout", flexdDriver), func(context.Context) error {
		if running(flexdDriver) {
			return fmt.Errorf("flexd's hanging driver (pid %d) still runs", flexdDriver)
		}
		return nil
	})
	// kubelet's FlexVolume plugin has no timeout for mount: no answer, the driver still running.
	// Its volume manager gives up waiting after 2m3s and says so in a FailedMount event of its own
	// ("Unable to attach or mount volumes: … timed out waiting for the condition"), every sync;
	// that is the pod's wait ending, not the mount answering (a CI run's failure until this said so).
	gomega.Expect(c.mountAnswers(ctx, hangKubelet)).To(gomega.BeEmpty(), "kubelet's mount returned")
	gomega.Expect(running(kubeletDriver)).To(gomega.BeTrue(), "kubelet's hanging driver (pid %d) ended", kubeletDriver)
	summary.Printf("where kubelet fails: a driver whose mount never returns (Kubernetes #31272)")
	summary.Printf("  kubelet: after %ds no answer from the mount, the pod ContainerCreating (last event: %q), the driver (pid %d) running for %ss",
		int(time.Since(q.started).Seconds()), cut(c.FailedMount(ctx, hangKubelet), 100), kubeletDriver, processAge(ctx, kubeletDriver))
	summary.Printf("  flexd:   the driver killed at flexd's call-out timeout (2 min); kubelet's CSI call ended %ds after the pod's creation and is retried: %s",
		answered, cut(c.FailedMount(ctx, hangFlexd), 160))

	ginkgo.By("deleting the hang pods: kubelet lets its pod go, its driver runs on")
	for _, pod := range []*corev1.Pod{hangKubelet, hangFlexd} {
		gomega.Expect(c.Kube.CoreV1().Pods(podNamespace).Delete(ctx, pod.Name, metav1.DeleteOptions{})).To(gomega.Succeed(), "deleting pod %s", pod.Name)
	}
	c.waitPodGone(ctx, hangKubelet.Name, 120*time.Second)
	// kubelet let the pod go, but its operation and the driver stay until killed by hand.
	gomega.Expect(running(kubeletDriver)).To(gomega.BeTrue(), "kubelet's hanging driver (pid %d) ended with its pod", kubeletDriver)
	// The driver of flexd's retry (kubelet retried the publish) would end at flexd's timeout, up
	// to 2 more minutes, and the pod's unpublish waits for it; both killed here.
	c.killHungDrivers()
	c.waitPodGone(ctx, hangFlexd.Name, 120*time.Second)
	c.DeletePod(ctx, chattyKubelet.Name)
	c.DeletePod(ctx, chattyFlexd.Name)
}

// controllerManagerDetached fails until the records hold kube-controller-manager's detach of
// the loop volume.
func (c *Cluster) controllerManagerDetached(context.Context) error {
	data, err := os.ReadFile(filepath.Join(c.oracleDir(), "records.jsonl"))
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(data), "\n") {
		var record struct {
			Caller string   `json:"caller"`
			Argv   []string `json:"argv"`
		}
		if json.Unmarshal([]byte(line), &record) != nil {
			continue
		}
		if strings.Contains(record.Caller, "kube-controller-manager") && slices.Contains(record.Argv, "detach") && slices.Contains(record.Argv, "oracle-loop") {
			return nil
		}
	}
	return fmt.Errorf("no detach of oracle-loop by kube-controller-manager recorded yet")
}

// oracleNode0Records are the records (a copy in run/, when there are workers) of node 0 and of
// the controller, wherever it runs: the oracle compares kubelet and flexd on one node. With
// several nodes, the workers' kubelets and flexd node pods probe the recorders too (init), in
// their own mount namespaces, into the same shared log; those calls are left out, and counted.
func (c *Cluster) oracleNode0Records(summary *Summary, records string) string {
	ginkgo.GinkgoHelper()
	workers := map[string]bool{}
	for _, node := range c.Nodes {
		if node.Worker() {
			init := strings.TrimSpace(ReadFile(node.Path("run", "init.pid")))
			ns, err := os.Readlink("/proc/" + init + "/ns/mnt")
			gomega.Expect(err).NotTo(gomega.HaveOccurred(), "node %s's mount namespace", node.Name)
			workers[ns] = true
		}
	}
	if len(workers) == 0 {
		return records
	}
	var kept []string
	left := 0
	for _, line := range strings.Split(ReadFile(records), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var record struct {
			Caller  string `json:"caller"`
			MountNS string `json:"mountNamespace"`
		}
		gomega.Expect(json.Unmarshal([]byte(line), &record)).To(gomega.Succeed(), "a record: %s", line)
		if workers[record.MountNS] && !strings.Contains(record.Caller, "--mode=controller") {
			left++
			continue
		}
		kept = append(kept, line)
	}
	summary.Printf("oracle: %d call-outs on the workers (their probes) left out", left)
	return c.WriteRun("oracle-records-node0.jsonl", strings.Join(kept, "\n")+"\n")
}
