package scenarios

// `flexd migrate --apply` (docs/migration.md#apply): the cut-over of docs/migration.md done by
// flexd itself against the API server, unit by unit, with its journal in a ConfigMap. Four
// workloads on FlexVolume, each a unit of its own: a Deployment on a PV of the node-only hostdir
// driver, a Deployment with an inline flexVolume of the same driver, a bare Pod (no controller)
// with an inline flexVolume of the same driver, deleted and created again by flexd
// (--recreate-pods), and a StatefulSet on a PV of the builtin loop driver, attached by
// kube-controller-manager's FlexVolume plugin. Every pod writes a marker once and appends a line
// a second to its volume. The plan first (nothing changed; without --recreate-pods the bare Pod
// refused); then --apply, killed (SIGKILL) as its journal reaches each step in turn and resumed
// each time, to the end: everything on CSI with its data; then --rollback: everything back on
// kubelet's FlexVolume plugin, the lines written on CSI kept.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

const (
	maHostdir = "e2e-mapply-hostdir" // Deployment, PV and claim of the hostdir driver (node-only)
	maInline  = "e2e-mapply-inline"  // Deployment with an inline flexVolume of the hostdir driver
	maLoop    = "e2e-mapply-loop"    // StatefulSet, PV and claim of the loop driver (attaches)
	maBare    = "e2e-mapply-bare"    // bare Pod with an inline flexVolume of the hostdir driver
	// The journal: this ConfigMap in the namespace --journal-namespace names (flexd's here), its
	// JSON under this key.
	maJournal    = "flexd-migration"
	maJournalKey = "journal.json"
	// How long one run of flexd migrate may take to reach a step, or to finish: it waits for
	// pods to stop, for kube-controller-manager's detach and for pods to be Ready again.
	maRunTimeout = 20 * time.Minute
)

// The steps of a unit's apply, in order, as the journal names them.
var maSteps = []string{"planned", "retained", "scaling-down", "scaled-down", "stopped", "swapping", "swapped", "done"}

// maTarget is where --apply (then --resume) is killed: as the unit of the workload (or bare
// Pod) of that name reaches the step; with pvGone, the run kills itself once the unit's PV is
// deleted, before its twin is created (the one moment a PV is missing).
type maTarget struct {
	workload, step string
	pvGone         bool
}

// The kills, in turn, spread over the four units (which run one after the other in this
// order) so that each step of the apply is interrupted once and each unit's swap, the attaching
// driver's included, is interrupted between delete and create; the bare Pod's unit as its Pod
// is deleted and not yet created again (the one moment its Pod is only in the journal).
var maTargets = []maTarget{
	{maHostdir, "retained", false}, {maHostdir, "swapping", true},
	{maInline, "scaling-down", false}, {maInline, "swapped", false},
	{maBare, "scaled-down", false},
	{maLoop, "stopped", false}, {maLoop, "swapping", false},
}

// maRank is the step's place in maSteps, -1 for another (a rollback's).
func maRank(step string) int { return slices.Index(maSteps, step) }

// maAtOrPast says whether a unit at step is at target or past it; a rollback's steps are only
// at themselves.
func maAtOrPast(step, target string) bool {
	if maRank(target) < 0 {
		return step == target
	}
	return maRank(step) >= maRank(target)
}

// maWorkload is one of the scenario's workloads, each its own unit.
type maWorkload struct {
	kind string // Deployment, StatefulSet or Pod (a bare one), as flexd prints it
	name string
	// The PV it mounts through its claim of the same name, "" for the inline volume.
	pv string
	// kubelet's dir name of the pod's volume: the PV's name, or the pod volume's ("data").
	volume     string
	flexDriver string
	csiDriver  string
}

// ref is the workload as flexd prints and journals it: `Kind namespace/name` (`Pod
// namespace/name` for the bare Pod, as in unit titles).
func (w maWorkload) ref() string { return w.kind + " " + podNamespace + "/" + w.name }

// bare says whether it is the bare Pod: in a unit's bare_pods (as nsName), not its workloads.
func (w maWorkload) bare() bool { return w.kind == "Pod" }

// nsName is `namespace/name`, as bare_pods and pods name a pod.
func (w maWorkload) nsName() string { return podNamespace + "/" + w.name }

// maWorkloads, each its own unit. Nothing here depends on the order flexd takes the units in;
// flexd's plan sorts them by title (`Kind namespace/name`, then `Pod namespace/name` for bare
// Pods), which makes the first, the one the kills land on, the Deployment on the hostdir PV: a
// unit with a PV to swap; the bare Pod's unit comes after the Deployments, before the
// StatefulSet.
func (c *Cluster) maWorkloads() []maWorkload {
	return []maWorkload{
		{kind: "Deployment", name: maHostdir, pv: maHostdir, volume: maHostdir, flexDriver: c.Driver, csiDriver: c.CSIName},
		{kind: "Deployment", name: maInline, volume: "data", flexDriver: c.Driver, csiDriver: c.CSIName},
		{kind: "Pod", name: maBare, volume: "data", flexDriver: c.Driver, csiDriver: c.CSIName},
		{kind: "StatefulSet", name: maLoop, pv: maLoop, volume: maLoop, flexDriver: loopDriver, csiDriver: loopCSIName},
	}
}

// maTitle names a unit by its workloads and bare Pods as flexd's unit titles do (without the
// PVs): `Kind ns/name, ..., Pod ns/name, ...`.
func maTitle(workloads, barePods []string) string {
	parts := slices.Clone(workloads)
	for _, p := range barePods {
		parts = append(parts, "Pod "+p)
	}
	return strings.Join(parts, ", ")
}

// What every pod runs: a marker written once (by the first pod), then a line a second, the
// time and the pod's UID, appended to the log for as long as it runs.
const maScript = `[ -e /data/marker ] || echo "marker $POD_UID $(date +%s)" > /data/marker
while :; do echo "$(date +%s) $POD_UID" >> /data/log; sleep 1; done`

// maTemplate is the workload's pod template: ToolsPod's pod (node 0 by a nodeSelector, not
// nodeName, so that the bare Pod flexd creates again without its nodeName lands there too;
// hostNetwork) running maScript with the volume at /data.
func (c *Cluster) maTemplate(name string, volume corev1.VolumeSource) corev1.PodTemplateSpec {
	pod := c.ToolsPod(name, "", volume, nil)
	pod.Spec.Containers[0].Command = []string{"/bin/sh", "-c", maScript}
	pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "POD_UID", ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.uid"},
	}}}
	return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}}, Spec: pod.Spec}
}

// maCreate creates the workload, one replica (the bare Pod: the pod itself); when the scenario
// ends it is deleted and its pods are waited out.
func (c *Cluster) maCreate(ctx context.Context, w maWorkload, volume corev1.VolumeSource) {
	ginkgo.GinkgoHelper()
	template := c.maTemplate(w.name, volume)
	selector := &metav1.LabelSelector{MatchLabels: template.Labels}
	var err error
	switch w.kind {
	case "Deployment":
		_, err = c.Kube.AppsV1().Deployments(podNamespace).Create(ctx, &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: w.name, Namespace: podNamespace},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To[int32](1),
				Selector: selector,
				// One pod at a time: the volumes are ReadWriteOnce.
				Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
				Template: template,
			},
		}, metav1.CreateOptions{})
	case "StatefulSet":
		// No Service behind serviceName: the pod needs no DNS name.
		_, err = c.Kube.AppsV1().StatefulSets(podNamespace).Create(ctx, &appsv1.StatefulSet{
			ObjectMeta: metav1.ObjectMeta{Name: w.name, Namespace: podNamespace},
			Spec: appsv1.StatefulSetSpec{
				Replicas:    ptr.To[int32](1),
				ServiceName: w.name,
				Selector:    selector,
				Template:    template,
			},
		}, metav1.CreateOptions{})
	case "Pod":
		// No owner: flexd refuses it unless --recreate-pods, then deletes it and creates it
		// again from the journal, with the same name, labels and nodeSelector.
		_, err = c.Kube.CoreV1().Pods(podNamespace).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: w.name, Namespace: podNamespace, Labels: template.Labels},
			Spec:       template.Spec,
		}, metav1.CreateOptions{})
	default:
		ginkgo.Fail("maCreate: no workload of kind " + w.kind)
	}
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "creating %s", w.ref())
	ginkgo.DeferCleanup(func(ctx context.Context) {
		_, err := c.Kubectl(ctx, "delete", strings.ToLower(w.kind), w.name, "--ignore-not-found", "--wait=true", "--timeout=180s")
		gomega.Expect(err).NotTo(gomega.HaveOccurred(), "deleting %s", w.ref())
		WaitFor(ctx, 180*time.Second, "the pods of "+w.ref()+" to go", func(ctx context.Context) error {
			pods, err := c.Kube.CoreV1().Pods(podNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + w.name})
			if err != nil {
				return err
			}
			if len(pods.Items) > 0 {
				return fmt.Errorf("%d pods left", len(pods.Items))
			}
			return nil
		})
	})
}

// maWorkloadReady fails until the workload's status says its one replica is Ready and up to
// date; the bare Pod's, until the pod of its name is there, Ready and not being deleted.
func (c *Cluster) maWorkloadReady(ctx context.Context, w maWorkload) error {
	switch w.kind {
	case "Pod":
		pod, err := c.Kube.CoreV1().Pods(podNamespace).Get(ctx, w.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !PodReady(pod) || pod.DeletionTimestamp != nil {
			return fmt.Errorf("%s: %s, ready=%v, deleting=%v", w.ref(), pod.Status.Phase, PodReady(pod), pod.DeletionTimestamp != nil)
		}
	case "Deployment":
		d, err := c.Kube.AppsV1().Deployments(podNamespace).Get(ctx, w.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s := d.Status
		if s.ObservedGeneration < d.Generation || s.Replicas != 1 || s.UpdatedReplicas != 1 || s.ReadyReplicas != 1 {
			return fmt.Errorf("%s: generation %d observed %d, replicas %d, updated %d, ready %d",
				w.ref(), d.Generation, s.ObservedGeneration, s.Replicas, s.UpdatedReplicas, s.ReadyReplicas)
		}
	case "StatefulSet":
		ss, err := c.Kube.AppsV1().StatefulSets(podNamespace).Get(ctx, w.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s := ss.Status
		if s.ObservedGeneration < ss.Generation || s.Replicas != 1 || s.ReadyReplicas != 1 {
			return fmt.Errorf("%s: generation %d observed %d, replicas %d, ready %d",
				w.ref(), ss.Generation, s.ObservedGeneration, s.Replicas, s.ReadyReplicas)
		}
	default:
		return fmt.Errorf("no workload of kind %s", w.kind)
	}
	return nil
}

// maLogLines are the log's lines written by the pod of the UID.
func maLogLines(log, uid string) int {
	n := 0
	for _, line := range strings.Split(log, "\n") {
		if strings.HasSuffix(line, " "+uid) {
			n++
		}
	}
	return n
}

// maPod waits until the workload is Ready with one pod (no other pod of it left) that has
// appended at least two lines to its log, and returns the pod. The bare Pod's is the pod of
// its name (and label), a new UID each time flexd creates it again.
func (c *Cluster) maPod(ctx context.Context, w maWorkload, timeout time.Duration) *corev1.Pod {
	ginkgo.GinkgoHelper()
	var ready *corev1.Pod
	WaitFor(ctx, timeout, "the pod of "+w.ref()+" Ready and writing", func(ctx context.Context) error {
		if err := c.maWorkloadReady(ctx, w); err != nil {
			return err
		}
		pods, err := c.Kube.CoreV1().Pods(podNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + w.name})
		if err != nil {
			return err
		}
		var seen []string
		for i := range pods.Items {
			pod := &pods.Items[i]
			seen = append(seen, fmt.Sprintf("%s %s ready=%v deleting=%v", pod.Name, pod.Status.Phase, PodReady(pod), pod.DeletionTimestamp != nil))
		}
		if len(pods.Items) != 1 || !PodReady(&pods.Items[0]) || pods.Items[0].DeletionTimestamp != nil {
			return fmt.Errorf("pods of %s: %v", w.ref(), seen)
		}
		pod := &pods.Items[0]
		log, err := c.Kubectl(ctx, "exec", pod.Name, "--", "cat", "/data/log")
		if err != nil {
			return err
		}
		if n := maLogLines(log, string(pod.UID)); n < 2 {
			return fmt.Errorf("pod %s has written %d lines to /data/log", pod.Name, n)
		}
		ready = pod
		return nil
	})
	return ready
}

// maData is what a workload's volume holds: the marker and the log.
type maData struct{ marker, log string }

func (c *Cluster) maRead(ctx context.Context, pod *corev1.Pod) maData {
	ginkgo.GinkgoHelper()
	return maData{marker: ReadFileInPod(ctx, c, pod.Name, "/data/marker"), log: ReadFileInPod(ctx, c, pod.Name, "/data/log")}
}

// maExpectKept fails unless the volume the pod sees still holds what was read before: the same
// marker, and the log as it was then, at its start (the log is only appended to).
func (c *Cluster) maExpectKept(ctx context.Context, w maWorkload, pod *corev1.Pod, before maData, when string) maData {
	ginkgo.GinkgoHelper()
	now := c.maRead(ctx, pod)
	gomega.Expect(now.marker).To(gomega.Equal(before.marker), "the marker of %s %s", w.ref(), when)
	lines := LogLines(before.log)
	gomega.Expect(strings.HasPrefix(now.log, before.log)).To(gomega.BeTrue(),
		"the log of %s %s keeps the %d lines it had (first %q, last %q); it has %d lines, first %q",
		w.ref(), when, len(lines), lines[0], lines[len(lines)-1], len(LogLines(now.log)), firstLine(now.log))
	gomega.Expect(maLogLines(now.log, string(pod.UID))).To(gomega.BeNumerically(">=", 2), "lines written by pod %s", pod.Name)
	return now
}

// maFlexTarget is where kubelet's FlexVolume plugin mounts the pod's volume; maCSITarget where
// its CSI plugin does.
func (c *Cluster) maFlexTarget(pod *corev1.Pod, w maWorkload) string {
	return c.Path("kubelet", "pods", string(pod.UID), "volumes", pluginDirName(w.flexDriver), w.volume)
}

func (c *Cluster) maCSITarget(pod *corev1.Pod, w maWorkload) string {
	return c.VolumeTarget(string(pod.UID), w.volume)
}

// maExpectPlaced fails unless the pod runs on node 0, where the mount checks look; the bare
// Pod, created again by flexd without its nodeName, keeps its name and is placed there by its
// nodeSelector alone.
func (c *Cluster) maExpectPlaced(pod *corev1.Pod, w maWorkload) {
	ginkgo.GinkgoHelper()
	gomega.Expect(pod.Spec.NodeName).To(gomega.Equal(c.Node), "the node of %s's pod %s", w.ref(), pod.Name)
	if w.bare() {
		gomega.Expect(pod.Name).To(gomega.Equal(w.name), "the name of %s, created again", w.ref())
		gomega.Expect(pod.OwnerReferences).To(gomega.BeEmpty(), "the owners of %s, created again", w.ref())
	}
}

// maArgs are flexd's arguments for `flexd migrate ARGS...` against this cluster, the journal in
// flexd's namespace.
func (c *Cluster) maArgs(args ...string) []string {
	return append(append([]string{"migrate"}, args...), "--kubeconfig", maKubeconfig, "--journal-namespace", c.Namespace)
}

// deleteMigrationJournal deletes `flexd migrate --apply`'s journal, if there is one.
func (c *Cluster) deleteMigrationJournal(ctx context.Context) {
	ginkgo.GinkgoHelper()
	err := c.Kube.CoreV1().ConfigMaps(c.Namespace).Delete(ctx, maJournal, metav1.DeleteOptions{})
	if !apierrors.IsNotFound(err) {
		gomega.Expect(err).NotTo(gomega.HaveOccurred(), "deleting the journal ConfigMap")
	}
}

// maKubeconfig is the migrator's: the ServiceAccount `flexd manifests --migrator` prints, with
// only the permissions it gives (docs/migration.md#rbac), so that a permission it lacks fails
// the scenario.
var maKubeconfig string

// maMigratorIdentity applies `flexd manifests --migrator` and writes a kubeconfig with a token
// of its ServiceAccount; the objects go when the scenario ends.
func (c *Cluster) maMigratorIdentity(ctx context.Context) string {
	ginkgo.GinkgoHelper()
	manifests := c.WriteRun("migrator.yaml", c.MustFlexd(ctx, "manifests", "--migrator", "--recreate-pods", "--namespace", c.Namespace))
	c.MustKubectl(ctx, "apply", "-f", manifests)
	ginkgo.DeferCleanup(func(ctx context.Context) {
		c.MustKubectl(ctx, "delete", "--ignore-not-found", "-f", manifests)
	})
	token := strings.TrimSpace(c.MustKubectl(ctx, "-n", c.Namespace, "create", "token", "flexd-migrator", "--duration", "2h"))
	admin := ReadFile(c.Path("kubeconfig"))
	server := regexp.MustCompile(`server: "?([^"\s,}]+)`).FindStringSubmatch(admin)
	gomega.Expect(server).NotTo(gomega.BeNil(), "the API server in %s", c.Path("kubeconfig"))
	// Only root reads it: it holds a token.
	path := c.Path("run", "migrator-kubeconfig")
	gomega.Expect(os.WriteFile(path, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: flexd-migrator, user: {token: %q}}]
contexts: [{name: migrator, context: {cluster: e2e, user: flexd-migrator}}]
current-context: migrator
`, server[1], c.Path("pki", "ca.crt"), token)), 0o600)).To(gomega.Succeed())
	return path
}

// --- the journal -------------------------------------------------------------------------------
// Read as the spec of `flexd migrate` gives it; anything else in it is left alone, and the old
// PVs are looked for anywhere in a unit's record (maHoldsPV). A bare Pod's unit has it in
// bare_pods (`namespace/name`), its workloads empty when it has no other; from scaling-down on,
// old_pods holds the Pod object as it was, what is created again.

type maJournalUnit struct {
	Workloads       []string       `json:"workloads"`
	BarePods        []string       `json:"bare_pods"`
	PVs             []string       `json:"pvs"`
	Step            string         `json:"step"`
	OldPods         map[string]any `json:"old_pods"`
	DowntimeSeconds *float64       `json:"downtime_seconds"`
}

// title names the unit by its workloads and bare Pods, for a message.
func (u maJournalUnit) title() string { return maTitle(u.Workloads, u.BarePods) }

type maJournalDoc struct {
	Version   int             `json:"version"`
	Operation string          `json:"operation"`
	Finished  bool            `json:"finished"`
	Units     []maJournalUnit `json:"units"`
	raw       []any           // each unit's record as it is
	text      string
}

// maUnreadable is the error of a journal that is there but does not parse.
var maUnreadable = errors.New("the journal does not parse")

// maReadJournal is the journal, nil when there is none; an error when it cannot be read.
func (c *Cluster) maReadJournal(ctx context.Context) (*maJournalDoc, error) {
	cm, err := c.Kube.CoreV1().ConfigMaps(c.Namespace).Get(ctx, maJournal, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	text, ok := cm.Data[maJournalKey]
	if !ok {
		return nil, fmt.Errorf("ConfigMap %s/%s has no %s: %v", c.Namespace, maJournal, maJournalKey, cm.Data)
	}
	j := &maJournalDoc{text: text}
	var raw struct {
		Units []any `json:"units"`
	}
	if err := json.Unmarshal([]byte(text), j); err != nil {
		return nil, fmt.Errorf("%w (%v):\n%s", maUnreadable, err, text)
	}
	if err := json.Unmarshal([]byte(text), &raw); err != nil {
		return nil, fmt.Errorf("%w (%v):\n%s", maUnreadable, err, text)
	}
	j.raw = raw.Units
	return j, nil
}

// maMustJournal is the journal, failing the spec when there is none or it cannot be read.
func (c *Cluster) maMustJournal(ctx context.Context) *maJournalDoc {
	ginkgo.GinkgoHelper()
	j, err := c.maReadJournal(ctx)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	gomega.Expect(j).NotTo(gomega.BeNil(), "the journal ConfigMap %s/%s", c.Namespace, maJournal)
	c.WriteRun("migrate-apply-journal.json", j.text)
	return j
}

// unitOfName is the index of the unit with the workload (`Kind ns/name`, matched by name) or
// the bare Pod (`ns/name`) of the name, -1 when none has it.
func (j *maJournalDoc) unitOfName(name string) int {
	return slices.IndexFunc(j.Units, func(u maJournalUnit) bool {
		return slices.ContainsFunc(u.Workloads, func(w string) bool { return strings.HasSuffix(w, "/"+name) }) ||
			slices.Contains(u.BarePods, podNamespace+"/"+name)
	})
}

// unitOf is the index of the unit whose PVs hold the PV, -1 when none does.
func (j *maJournalDoc) unitOf(pv string) int {
	return slices.IndexFunc(j.Units, func(u maJournalUnit) bool { return slices.Contains(u.PVs, pv) })
}

// steps is every unit's step, for a message.
func (j *maJournalDoc) steps() string {
	var steps []string
	for i, u := range j.Units {
		steps = append(steps, fmt.Sprintf("unit %d (%s): %s", i+1, u.title(), u.Step))
	}
	return strings.Join(steps, "; ")
}

// maHoldsPV says whether the record holds, anywhere in it, the FlexVolume PV of the name: an
// object with metadata.name and spec.flexVolume (also inside a string holding JSON).
func maHoldsPV(record any, name string) bool {
	switch v := record.(type) {
	case map[string]any:
		if meta, ok := v["metadata"].(map[string]any); ok && meta["name"] == name {
			if spec, ok := v["spec"].(map[string]any); ok && spec["flexVolume"] != nil {
				return true
			}
		}
		for _, value := range v {
			if maHoldsPV(value, name) {
				return true
			}
		}
	case []any:
		for _, value := range v {
			if maHoldsPV(value, name) {
				return true
			}
		}
	case string:
		var inner any
		if strings.HasPrefix(strings.TrimSpace(v), "{") && json.Unmarshal([]byte(v), &inner) == nil {
			return maHoldsPV(inner, name)
		}
	}
	return false
}

// maHoldsPod says whether the record (a value of a unit's old_pods) is the Pod of the name as
// it was before the apply: metadata.name, and a flexVolume among spec.volumes.
func maHoldsPod(record any, name string) bool {
	pod, _ := record.(map[string]any)
	meta, _ := pod["metadata"].(map[string]any)
	spec, _ := pod["spec"].(map[string]any)
	if meta == nil || spec == nil || meta["name"] != name {
		return false
	}
	volumes, _ := spec["volumes"].([]any)
	return slices.ContainsFunc(volumes, func(v any) bool {
		volume, _ := v.(map[string]any)
		return volume["flexVolume"] != nil
	})
}

// --- flexd migrate in the background -----------------------------------------------------------

// maRun is one `flexd migrate` running in the background.
type maRun struct {
	label          string
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	// The step events of its -o json progress, as they are printed: flexd prints one just after
	// writing the step to the journal, so a kill on it lands in the next step's work.
	steps chan maStepEvent
	done  chan struct{}
	err   error
}

// maStepEvent is a step event; a bare Pod's unit is told by its index (unit, from 1) in the
// journal, written before the event is printed (its workloads are empty; bare_pods, if flexd
// prints them, are matched too).
type maStepEvent struct {
	Event     string   `json:"event"`
	Unit      int      `json:"unit"`
	Step      string   `json:"step"`
	Workloads []string `json:"workloads"`
	BarePods  []string `json:"bare_pods"`
}

// maLines keeps what it is written in out and sends each complete line that is a step event.
type maLines struct {
	out     *bytes.Buffer
	partial []byte
	steps   chan<- maStepEvent
}

func (l *maLines) Write(p []byte) (int, error) {
	l.out.Write(p)
	l.partial = append(l.partial, p...)
	for {
		end := bytes.IndexByte(l.partial, '\n')
		if end < 0 {
			return len(p), nil
		}
		var event maStepEvent
		if json.Unmarshal(l.partial[:end], &event) == nil && event.Event == "step" {
			select {
			case l.steps <- event:
			default: // nobody is waiting for this many; the journal still says it
			}
		}
		l.partial = l.partial[end+1:]
	}
}

// maStart starts `flexd migrate ARGS...`; label names its output, saved in run/ when it ends.
func (c *Cluster) maStart(ctx context.Context, label string, args ...string) *maRun {
	ginkgo.GinkgoHelper()
	return c.maStartEnv(ctx, label, nil, args...)
}

// maStartEnv is maStart with more environment (VAR=value).
func (c *Cluster) maStartEnv(ctx context.Context, label string, env []string, args ...string) *maRun {
	ginkgo.GinkgoHelper()
	r := &maRun{label: label, done: make(chan struct{}), steps: make(chan maStepEvent, 256)}
	r.cmd = exec.CommandContext(ctx, c.Path("bin", "flexd"), c.maArgs(args...)...)
	r.cmd.Env = append(os.Environ(), env...)
	r.cmd.Stdout, r.cmd.Stderr = &maLines{out: &r.stdout, steps: r.steps}, &r.stderr
	fmt.Fprintf(ginkgo.GinkgoWriter, "%s: flexd %s\n", label, strings.Join(r.cmd.Args[1:], " "))
	gomega.Expect(r.cmd.Start()).To(gomega.Succeed(), "starting flexd migrate (%s)", label)
	go func() {
		r.err = r.cmd.Wait()
		close(r.done)
	}()
	return r
}

// ended says whether the run has ended.
func (r *maRun) ended() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// output is how the run ended and what it printed, once it has ended.
func (r *maRun) output() string {
	return fmt.Sprintf("flexd %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(r.cmd.Args[1:], " "), r.err, r.stdout.String(), r.stderr.String())
}

// kill kills the run (SIGKILL), if it still runs, and waits for it; its output is saved.
func (c *Cluster) maKill(r *maRun) {
	if !r.ended() {
		_ = r.cmd.Process.Signal(syscall.SIGKILL)
	}
	<-r.done
	c.maSaveOutput(r)
}

func (c *Cluster) maSaveOutput(r *maRun) {
	fmt.Fprintf(ginkgo.GinkgoWriter, "%s:\n%s\n", r.label, r.output())
	_ = os.WriteFile(c.Path("run", "migrate-apply-"+r.label+".out"), []byte(r.output()), 0o644)
}

// maWait waits for the run to end by itself, and fails unless it exited 0.
func (c *Cluster) maWait(ctx context.Context, r *maRun, timeout time.Duration) {
	ginkgo.GinkgoHelper()
	select {
	case <-r.done:
	case <-time.After(timeout):
	case <-ctx.Done():
	}
	if !r.ended() {
		c.maKill(r)
		ginkgo.Fail(fmt.Sprintf("flexd migrate (%s) did not end within %s:\n%s", r.label, timeout, r.output()))
	}
	c.maSaveOutput(r)
	gomega.Expect(r.err).NotTo(gomega.HaveOccurred(), "flexd migrate (%s):\n%s", r.label, r.output())
}

// maKillAt kills the run as soon as the target's unit is at its step or past it, on the run's
// step event (-o json, printed just after the journal write); it says where the run was when it
// was killed. A step event is the target's
// when its workloads (or bare Pods) name it, or its unit is the target's unit in the journal
// (read once, at the first event that does not name it: the unit of a bare Pod alone has no
// workloads).
func (c *Cluster) maKillAt(ctx context.Context, r *maRun, t maTarget) string {
	target := t.step
	ginkgo.GinkgoHelper()
	deadline := time.Now().Add(maRunTimeout)
	ticker := time.NewTicker(200 * time.Millisecond)
	defer ticker.Stop()
	unit := -1 // the target's unit in the journal, once known
	for {
		select {
		case <-r.done:
			c.maSaveOutput(r)
			ginkgo.Fail(fmt.Sprintf("flexd migrate (%s) ended before a unit reached step %s:\n%s", r.label, target, r.output()))
		case <-ctx.Done():
			c.maKill(r)
			ginkgo.Fail(fmt.Sprintf("the spec ended while waiting for step %s (%s)", target, r.label))
		case event := <-r.steps:
			of := slices.ContainsFunc(event.Workloads, func(w string) bool { return strings.HasSuffix(w, "/"+t.workload) }) ||
				slices.Contains(event.BarePods, podNamespace+"/"+t.workload)
			if !of && unit < 0 {
				if j, err := c.maReadJournal(ctx); err == nil && j != nil {
					unit = j.unitOfName(t.workload)
				}
			}
			of = of || (unit >= 0 && event.Unit == unit+1)
			if of && maAtOrPast(event.Step, target) {
				c.maKill(r)
				return fmt.Sprintf("at its step event %s of unit %d (%s)", event.Step, event.Unit, maTitle(event.Workloads, event.BarePods))
			}
			continue
		case <-ticker.C:
		}
		// Only the step events decide: the journal, read in between, can be a step ahead.
		if time.Now().After(deadline) {
			c.maKill(r)
			steps := "no journal"
			if j, err := c.maReadJournal(ctx); err == nil && j != nil {
				steps = j.steps()
			}
			ginkgo.Fail(fmt.Sprintf("no unit reached step %s within %s (%s); %s:\n%s", target, maRunTimeout, steps, r.label, r.output()))
		}
	}
}

// maDiesAtPVGone waits for a run started with FLEXD_TEST_KILL_AT=pv-deleted to kill itself
// (SIGKILL) with a PV deleted and its twin not yet created: the few milliseconds no outside
// kill hits on time.
func (c *Cluster) maDiesAtPVGone(ctx context.Context, r *maRun) string {
	ginkgo.GinkgoHelper()
	select {
	case <-r.done:
	case <-time.After(maRunTimeout):
	case <-ctx.Done():
	}
	c.maKill(r)
	var exit *exec.ExitError
	gomega.Expect(errors.As(r.err, &exit)).To(gomega.BeTrue(), "flexd migrate (%s) was to die by SIGKILL:\n%s", r.label, r.output())
	status, ok := exit.Sys().(syscall.WaitStatus)
	gomega.Expect(ok && status.Signaled() && status.Signal() == syscall.SIGKILL).To(gomega.BeTrue(),
		"flexd migrate (%s) was to die by SIGKILL:\n%s", r.label, r.output())
	return "itself, between a PV's delete and create (FLEXD_TEST_KILL_AT=pv-deleted)"
}

// maExpectNothingLost: after a kill, every PV of the scenario is there, or (only while its unit
// is at swapping) the journal holds it, the FlexVolume object a rollback creates again; the
// PVs of a unit at retained or past it are Retain; the claims are there. The bare Pod is
// there, or (only from its unit's scaling-down to swapped, or rolling back) deleted; from
// scaling-down on, the journal holds it as it was, what is created again.
// It says which PVs (and whether the bare Pod) were missing (and held by the journal).
func (c *Cluster) maExpectNothingLost(ctx context.Context) string {
	ginkgo.GinkgoHelper()
	j := c.maMustJournal(ctx)
	held := "every PV there"
	for _, name := range []string{maHostdir, maLoop} {
		unit := j.unitOf(name)
		gomega.Expect(unit).To(gomega.BeNumerically(">=", 0), "the journal's unit of PV %s:\n%s", name, j.text)
		step := j.Units[unit].Step
		pv, err := c.Kube.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			gomega.Expect(pv.Spec.FlexVolume != nil || pv.Spec.CSI != nil).To(gomega.BeTrue(), "PV %s has neither flexVolume nor csi: %v", name, pv.Spec)
			if maRank(step) >= maRank("retained") {
				gomega.Expect(pv.Spec.PersistentVolumeReclaimPolicy).To(gomega.Equal(corev1.PersistentVolumeReclaimRetain),
					"the reclaim policy of PV %s, its unit at %s", name, step)
			}
			continue
		}
		gomega.Expect(apierrors.IsNotFound(err)).To(gomega.BeTrue(), "getting PV %s: %v", name, err)
		gomega.Expect(step).To(gomega.BeElementOf("swapping", "rolling-back"), "PV %s is gone, its unit at %s (only while swapping may it be)", name, step)
		gomega.Expect(maHoldsPV(j.raw[unit], name)).To(gomega.BeTrue(), "PV %s is gone and the journal does not hold it:\n%s", name, j.text)
		held = "PV " + name + " missing, held by the journal"
	}
	for _, claim := range []string{maHostdir, maLoop} {
		_, err := c.Kube.CoreV1().PersistentVolumeClaims(podNamespace).Get(ctx, claim, metav1.GetOptions{})
		gomega.Expect(err).NotTo(gomega.HaveOccurred(), "claim %s", claim)
	}
	unit := j.unitOfName(maBare)
	gomega.Expect(unit).To(gomega.BeNumerically(">=", 0), "the journal's unit of Pod %s/%s:\n%s", podNamespace, maBare, j.text)
	u := j.Units[unit]
	saved := maHoldsPod(u.OldPods[podNamespace+"/"+maBare], maBare)
	if maRank(u.Step) >= maRank("scaling-down") {
		gomega.Expect(saved).To(gomega.BeTrue(), "the journal holds Pod %s/%s as it was, its unit at %s:\n%s", podNamespace, maBare, u.Step, j.text)
	}
	_, err := c.Kube.CoreV1().Pods(podNamespace).Get(ctx, maBare, metav1.GetOptions{})
	if err != nil {
		gomega.Expect(apierrors.IsNotFound(err)).To(gomega.BeTrue(), "getting Pod %s: %v", maBare, err)
		gomega.Expect((maRank(u.Step) >= maRank("scaling-down") && maRank(u.Step) <= maRank("swapped")) || u.Step == "rolling-back").To(gomega.BeTrue(),
			"Pod %s/%s is gone, its unit at %s (only from scaling-down to swapped may it be)", podNamespace, maBare, u.Step)
		gomega.Expect(saved).To(gomega.BeTrue(), "Pod %s/%s is gone and the journal does not hold it:\n%s", podNamespace, maBare, j.text)
		held += "; Pod " + maBare + " missing, held by the journal"
	}
	return held
}

// --- the plan ----------------------------------------------------------------------------------

type maPlanPV struct {
	Name      string `json:"name"`
	Driver    string `json:"driver"`
	CSIDriver string `json:"csi_driver"`
	Claim     string `json:"claim"`
	Attaches  bool   `json:"attaches"`
}

type maPlanUnit struct {
	Workloads []string   `json:"workloads"`
	BarePods  []string   `json:"bare_pods"`
	PVs       []maPlanPV `json:"pvs"`
	Templates []string   `json:"templates"`
	Pods      []string   `json:"pods"`
}

type maPlan struct {
	Units   []maPlanUnit `json:"units"`
	Refused []maRefused  `json:"refused"`
}

type maRefused struct {
	What   string `json:"what"`
	Reason string `json:"reason"`
}

// maSummaryEvent is the last line of a run with -o json.
type maSummaryEvent struct {
	Event string          `json:"event"`
	Units []maSummaryUnit `json:"units"`
}

type maSummaryUnit struct {
	Workloads       []string `json:"workloads"`
	BarePods        []string `json:"bare_pods"`
	PVs             []string `json:"pvs"`
	DowntimeSeconds *float64 `json:"downtime_seconds"`
}

// title names the unit by its workloads and bare Pods, for a message.
func (u maSummaryUnit) title() string { return maTitle(u.Workloads, u.BarePods) }

// maExpectSummary fails unless the summary has one unit per workload, the workload alone in
// it (the bare Pod alone in its bare_pods, no workloads), each with its downtime.
func maExpectSummary(done *maSummaryEvent, workloads []maWorkload, output string) {
	ginkgo.GinkgoHelper()
	gomega.Expect(done.Units).To(gomega.HaveLen(len(workloads)), "the summary's units:\n%s", output)
	for _, w := range workloads {
		gomega.Expect(slices.ContainsFunc(done.Units, func(u maSummaryUnit) bool {
			if w.bare() {
				return len(u.Workloads) == 0 && slices.Equal(u.BarePods, []string{w.nsName()})
			}
			return slices.Equal(u.Workloads, []string{w.ref()}) && len(u.BarePods) == 0
		})).To(gomega.BeTrue(), "a unit of %s alone in the summary:\n%s", w.ref(), output)
	}
	for _, u := range done.Units {
		gomega.Expect(u.DowntimeSeconds).NotTo(gomega.BeNil(), "the downtime of %s in the summary", u.title())
		gomega.Expect(*u.DowntimeSeconds).To(gomega.BeNumerically(">", 0), "the downtime of %s in the summary", u.title())
	}
}

// maEvents are the run's JSON lines on stdout, each parsed (the plan --apply prints first is
// one too); the summary event among them.
func maEvents(stdout string) ([]map[string]any, *maSummaryEvent) {
	ginkgo.GinkgoHelper()
	var events []map[string]any
	var summary *maSummaryEvent
	for _, line := range strings.Split(stdout, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var event map[string]any
		gomega.Expect(json.Unmarshal([]byte(line), &event)).To(gomega.Succeed(), "a line of flexd migrate -o json: %s", line)
		events = append(events, event)
		if event["event"] == "summary" {
			summary = &maSummaryEvent{}
			gomega.Expect(json.Unmarshal([]byte(line), summary)).To(gomega.Succeed(), "the summary: %s", line)
		}
	}
	return events, summary
}

// scenarioMigrateApply: see the file's comment.
func scenarioMigrateApply(ctx context.Context) {
	c := cluster
	summary := c.NewSummary("migrate_apply")
	workloads := c.maWorkloads()
	flexd := c.Path("bin", "flexd")

	ginkgo.By("flexd deployed for every installed driver, the loop driver among them, with its controller")
	c.InstallLoop(ctx)
	c.ApplyAllManifests(ctx, "flexd-migrate-apply")
	c.WaitCSINodeLists(ctx, loopCSIName)
	c.WaitCSINodeLists(ctx, c.CSIName)
	maKubeconfig = c.maMigratorIdentity(ctx)

	// A journal left by an earlier run would make --apply refuse; when the scenario ends, the
	// one it made goes.
	c.deleteMigrationJournal(ctx)
	ginkgo.DeferCleanup(c.deleteMigrationJournal)
	// The hostdir driver's dirs (on node 0, where the pods run), fresh, and removed last.
	hostDirs := []string{c.Path("volumes", maHostdir), c.Path("volumes", maInline), c.Path("volumes", maBare)}
	removeHostDirs := func() {
		for _, dir := range hostDirs {
			gomega.Expect(os.RemoveAll(dir)).To(gomega.Succeed())
		}
	}
	removeHostDirs()
	ginkgo.DeferCleanup(removeHostDirs)
	// The loop driver's image and claim, after the PV and claim are gone (cleanups run last in,
	// first out) and the volume is detached, whichever way it was attached.
	loopFiles := []string{filepath.Join(c.SharedDir, maLoop+".img"), filepath.Join(c.SharedDir, "."+maLoop+".claim")}
	removeLoopFiles := func() {
		for _, file := range loopFiles {
			if err := os.Remove(file); err != nil && !os.IsNotExist(err) {
				gomega.Expect(err).NotTo(gomega.HaveOccurred(), "removing %s", file)
			}
		}
	}
	removeLoopFiles()
	ginkgo.DeferCleanup(func(ctx context.Context) {
		WaitFor(ctx, 180*time.Second, maLoop+" detached from every node", c.flexAttachedTo(maLoop))
		c.waitDetached(ctx, maLoop, 180*time.Second)
		removeLoopFiles()
	})

	ginkgo.By("the FlexVolume objects: a PV of the loop driver and one of the hostdir driver, and their claims")
	loop := FlexSource(loopDriver, map[string]string{"size": "64Mi"})
	loop.FlexVolume.FSType = "ext4"
	c.StaticClaim(ctx, PersistentVolume(maLoop, "64Mi", loop))
	// Delete, so that the first thing --apply does, Retain, shows.
	hostdirPV := PersistentVolume(maHostdir, "1Gi", FlexSource(c.Driver, map[string]string{"greeting": "migrate apply"}))
	hostdirPV.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimDelete
	c.StaticClaim(ctx, hostdirPV)
	before := map[string]*corev1.PersistentVolume{}
	for _, name := range []string{maHostdir, maLoop} {
		pv, err := c.Kube.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
		gomega.Expect(pv.Spec.ClaimRef).NotTo(gomega.BeNil(), "PV %s's claimRef once Bound", name)
		before[name] = pv
	}

	ginkgo.By("the workloads: a StatefulSet on the loop PV, a Deployment on the hostdir PV, a Deployment and a bare Pod with an inline flexVolume")
	// The hostdir driver finds a volume's dir by its option "volume", else by
	// kubernetes.io/pvOrVolumeName. An inline CSI volume's pvOrVolumeName is kubelet's own id
	// for it (csi-<hash of the pod's UID and the volume's name>, a new one per pod;
	// docs/migration.md#inline), where FlexVolume passed the pod volume's name: without the
	// option every pod on CSI would get an empty dir. With it, both plugins mount the same host
	// dir, and the data must survive the migration and the rollback like a PV's. The bare Pod's
	// volume has a dir of its own.
	inline := map[string]corev1.VolumeSource{
		maInline: InlineFlexVolume(c.Driver, map[string]string{"volume": maInline, "greeting": "migrate apply inline"}),
		maBare:   InlineFlexVolume(c.Driver, map[string]string{"volume": maBare, "greeting": "migrate apply bare"}),
	}
	for _, w := range workloads {
		volume := inline[w.name]
		if w.pv != "" {
			volume = ClaimVolume(w.pv)
		}
		c.maCreate(ctx, w, volume)
	}
	pods := map[string]*corev1.Pod{}
	data := map[string]maData{}
	for _, w := range workloads {
		pods[w.name] = c.maPod(ctx, w, 300*time.Second)
		gomega.Expect(MountCount(c.maFlexTarget(pods[w.name], w))).To(gomega.Equal(1),
			"%s's volume mounted by kubelet's FlexVolume plugin at %s", w.ref(), c.maFlexTarget(pods[w.name], w))
		data[w.name] = c.maRead(ctx, pods[w.name])
	}
	WaitFor(ctx, 60*time.Second, maLoop+" attached to "+c.Node+" by kube-controller-manager", c.flexAttachedTo(maLoop, c.Node))
	gomega.Expect(c.attachmentOf(ctx, maLoop)).To(gomega.Equal(""), "a VolumeAttachment of %s while on FlexVolume", maLoop)

	ginkgo.By("--plan --all -o json without --recreate-pods: the bare Pod refused, three units")
	bare := "Pod " + podNamespace + "/" + maBare
	refusingOut := MustRun(ctx, flexd, c.maArgs("--plan", "--all", "-o", "json")...)
	c.WriteRun("migrate-apply-plan-refusing.json", refusingOut)
	var refusing maPlan
	gomega.Expect(json.Unmarshal([]byte(refusingOut), &refusing)).To(gomega.Succeed(), "the plan, one JSON object:\n%s", refusingOut)
	gomega.Expect(refusing.Units).To(gomega.HaveLen(len(workloads)-1), "every unit but the bare Pod's in the plan's units without --recreate-pods:\n%s", refusingOut)
	gomega.Expect(refusing.Refused).NotTo(gomega.BeEmpty(), "refused in the plan without --recreate-pods:\n%s", refusingOut)
	for _, r := range refusing.Refused {
		gomega.Expect(r.What).To(gomega.Equal(bare), "what the plan without --recreate-pods refuses:\n%s", refusingOut)
	}
	gomega.Expect(slices.ContainsFunc(refusing.Refused, func(r maRefused) bool { return strings.Contains(r.Reason, "--recreate-pods") })).To(gomega.BeTrue(), "%s refused with a reason that names --recreate-pods:\n%s", bare, refusingOut)
	for _, u := range refusing.Units {
		gomega.Expect(u.BarePods).To(gomega.BeEmpty(), "the bare Pods of a unit of the plan without --recreate-pods:\n%s", refusingOut)
		gomega.Expect(u.Pods).NotTo(gomega.ContainElement(podNamespace+"/"+maBare), "the pods of a unit of the plan without --recreate-pods:\n%s", refusingOut)
	}
	summary.Printf("migrate_apply: the plan without --recreate-pods: %d units, %d refused (%s: %s)",
		len(refusing.Units), len(refusing.Refused), refusing.Refused[0].What, refusing.Refused[0].Reason)

	ginkgo.By("--plan --all --recreate-pods -o json: four units, the bare Pod's its own, nothing changed")
	planOut := MustRun(ctx, flexd, c.maArgs("--plan", "--all", "--recreate-pods", "-o", "json")...)
	c.WriteRun("migrate-apply-plan.json", planOut)
	var plan maPlan
	gomega.Expect(json.Unmarshal([]byte(planOut), &plan)).To(gomega.Succeed(), "the plan, one JSON object:\n%s", planOut)
	gomega.Expect(plan.Refused).To(gomega.BeEmpty(), "refused in the plan:\n%s", planOut)
	gomega.Expect(plan.Units).To(gomega.HaveLen(len(workloads)), "the plan's units:\n%s", planOut)
	for _, w := range workloads {
		i := slices.IndexFunc(plan.Units, func(u maPlanUnit) bool {
			if w.bare() {
				return slices.Equal(u.BarePods, []string{w.nsName()})
			}
			return slices.Equal(u.Workloads, []string{w.ref()})
		})
		gomega.Expect(i).To(gomega.BeNumerically(">=", 0), "a unit of %s alone in the plan:\n%s", w.ref(), planOut)
		unit := plan.Units[i]
		var pvs []maPlanPV
		var templates, workloadRefs, barePods []string
		switch {
		case w.bare():
			barePods = append(barePods, w.nsName())
		case w.pv != "":
			pvs = append(pvs, maPlanPV{Name: w.pv, Driver: w.flexDriver, CSIDriver: w.csiDriver,
				Claim: podNamespace + "/" + w.pv, Attaches: w.flexDriver == loopDriver})
			workloadRefs = append(workloadRefs, w.ref())
		default:
			templates = append(templates, w.ref())
			workloadRefs = append(workloadRefs, w.ref())
		}
		gomega.Expect(unit.Workloads).To(gomega.ConsistOf(workloadRefs), "the workloads of %s's unit", w.ref())
		gomega.Expect(unit.BarePods).To(gomega.ConsistOf(barePods), "the bare Pods of %s's unit", w.ref())
		gomega.Expect(unit.PVs).To(gomega.ConsistOf(pvs), "the PVs of %s's unit", w.ref())
		gomega.Expect(unit.Templates).To(gomega.ConsistOf(templates), "the templates of %s's unit", w.ref())
		gomega.Expect(unit.Pods).To(gomega.ConsistOf([]string{podNamespace + "/" + pods[w.name].Name}), "the pods of %s's unit", w.ref())
	}
	summary.Printf("migrate_apply: the plan: %d units, %d refused", len(plan.Units), len(plan.Refused))

	ginkgo.By("--apply without --yes and without a terminal: refused, exit 1, nothing changed")
	_, err := Run(ctx, flexd, c.maArgs("--apply", "--all", "--recreate-pods")...)
	var exit *exec.ExitError
	gomega.Expect(errors.As(err, &exit)).To(gomega.BeTrue(), "flexd migrate --apply without --yes: %v", err)
	gomega.Expect(exit.ExitCode()).To(gomega.Equal(1), "flexd migrate --apply without --yes: %v", err)
	j, err := c.maReadJournal(ctx)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	gomega.Expect(j).To(gomega.BeNil(), "a journal after --plan and a refused --apply")
	for name, old := range before {
		pv, err := c.Kube.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
		gomega.Expect(pv.UID).To(gomega.Equal(old.UID), "PV %s, the same object", name)
		gomega.Expect(pv.Spec.FlexVolume).NotTo(gomega.BeNil(), "PV %s's flexVolume", name)
		gomega.Expect(pv.Spec.PersistentVolumeReclaimPolicy).To(gomega.Equal(old.Spec.PersistentVolumeReclaimPolicy), "PV %s's reclaim policy", name)
	}
	for _, w := range workloads {
		pod := c.GetPod(ctx, pods[w.name].Name)
		gomega.Expect(pod.UID).To(gomega.Equal(pods[w.name].UID), "the pod of %s, the same", w.ref())
		gomega.Expect(PodReady(pod)).To(gomega.BeTrue(), "the pod of %s Ready", w.ref())
	}

	ginkgo.By("--apply --all --recreate-pods --yes -o json, killed (SIGKILL) as a unit reaches each step, --resume --yes each time")
	var current *maRun
	// Before anything is deleted: no flexd migrate left running.
	ginkgo.DeferCleanup(func() {
		if current != nil {
			c.maKill(current)
		}
	})
	current = c.maStart(ctx, "apply", "--apply", "--all", "--recreate-pods", "--yes", "-o", "json")
	var after *maJournalDoc // the journal when the last run was killed
	for n, target := range maTargets {
		if after != nil {
			if i := after.unitOfName(target.workload); i >= 0 && maAtOrPast(after.Units[i].Step, target.step) {
				summary.Printf("migrate_apply: kill %d: %s's step %s passed before the run began (%s)", n+1, target.workload, target.step, current.label)
				continue
			}
		}
		var where string
		if target.pvGone {
			where = c.maDiesAtPVGone(ctx, current)
		} else {
			where = c.maKillAt(ctx, current, target)
		}
		after = c.maMustJournal(ctx)
		summary.Printf("migrate_apply: kill %d: %s killed %s (target %s %s); the journal: %s", n+1, current.label, where, target.workload, target.step, after.steps())
		summary.Printf("migrate_apply: kill %d: %s", n+1, c.maExpectNothingLost(ctx))
		var env []string
		if n+1 < len(maTargets) && maTargets[n+1].pvGone {
			env = append(env, "FLEXD_TEST_KILL_AT=pv-deleted")
		}
		current = c.maStartEnv(ctx, fmt.Sprintf("resume-%d", n+1), env, "--resume", "--yes", "-o", "json")
	}
	ginkgo.By("the last --resume --yes -o json, to the end")
	c.maWait(ctx, current, maRunTimeout)
	events, done := maEvents(current.stdout.String())
	gomega.Expect(done).NotTo(gomega.BeNil(), "a summary event from the last --resume:\n%s", current.output())
	gomega.Expect(events[len(events)-1]["event"]).To(gomega.Equal("summary"), "the last line of the last --resume:\n%s", current.output())
	gomega.Expect(slices.ContainsFunc(events, func(e map[string]any) bool { return e["event"] == "step" })).To(gomega.BeTrue(),
		"step events from the last --resume:\n%s", current.output())
	j = c.maMustJournal(ctx)
	gomega.Expect(j.Operation).To(gomega.Equal("apply"), "the journal's operation")
	gomega.Expect(j.Finished).To(gomega.BeTrue(), "the journal finished:\n%s", j.text)
	gomega.Expect(j.Units).To(gomega.HaveLen(len(workloads)), "the journal's units:\n%s", j.text)
	for _, u := range j.Units {
		gomega.Expect(u.Step).To(gomega.Equal("done"), "the step of %s:\n%s", u.title(), j.text)
	}
	// The bare Pod's unit: the Pod alone, no workloads, and the Pod object as it was before
	// (on FlexVolume), what was created again.
	bareUnit := j.unitOfName(maBare)
	gomega.Expect(bareUnit).To(gomega.BeNumerically(">=", 0), "the journal's unit of %s:\n%s", bare, j.text)
	gomega.Expect(j.Units[bareUnit].Workloads).To(gomega.BeEmpty(), "the workloads of %s's unit:\n%s", bare, j.text)
	gomega.Expect(j.Units[bareUnit].BarePods).To(gomega.Equal([]string{podNamespace + "/" + maBare}), "the bare Pods of %s's unit:\n%s", bare, j.text)
	gomega.Expect(maHoldsPod(j.Units[bareUnit].OldPods[podNamespace+"/"+maBare], maBare)).To(gomega.BeTrue(),
		"the journal's old_pods hold %s as it was:\n%s", bare, j.text)

	ginkgo.By("every PV on CSI with its name and claim, the claims Bound, every workload Ready on CSI with its data")
	for _, w := range workloads {
		if w.pv == "" {
			continue
		}
		pv, err := c.Kube.CoreV1().PersistentVolumes().Get(ctx, w.pv, metav1.GetOptions{})
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
		old := before[w.pv]
		gomega.Expect(pv.Spec.FlexVolume).To(gomega.BeNil(), "PV %s's flexVolume after the migration", w.pv)
		gomega.Expect(pv.Spec.CSI).NotTo(gomega.BeNil(), "PV %s's csi after the migration", w.pv)
		gomega.Expect(pv.Spec.CSI.Driver).To(gomega.Equal(w.csiDriver), "PV %s's CSI driver", w.pv)
		// docs/migration.md#same-volume: the volume handle is the name, the attributes the options.
		gomega.Expect(pv.Spec.CSI.VolumeHandle).To(gomega.Equal(w.pv), "PV %s's volume handle", w.pv)
		gomega.Expect(pv.Spec.CSI.VolumeAttributes).To(gomega.Equal(old.Spec.FlexVolume.Options), "PV %s's volume attributes", w.pv)
		gomega.Expect(pv.Spec.CSI.FSType).To(gomega.Equal(old.Spec.FlexVolume.FSType), "PV %s's fsType", w.pv)
		gomega.Expect(pv.Spec.ClaimRef).NotTo(gomega.BeNil(), "PV %s's claimRef", w.pv)
		gomega.Expect([]string{pv.Spec.ClaimRef.Namespace, pv.Spec.ClaimRef.Name, string(pv.Spec.ClaimRef.UID)}).To(
			gomega.Equal([]string{old.Spec.ClaimRef.Namespace, old.Spec.ClaimRef.Name, string(old.Spec.ClaimRef.UID)}), "PV %s's claimRef", w.pv)
		gomega.Expect(pv.Spec.PersistentVolumeReclaimPolicy).To(gomega.Equal(corev1.PersistentVolumeReclaimRetain), "PV %s's reclaim policy", w.pv)
		c.WaitClaimBound(ctx, w.pv, 120*time.Second)
	}
	for _, w := range workloads {
		pod := c.maPod(ctx, w, 300*time.Second)
		gomega.Expect(pod.UID).NotTo(gomega.Equal(pods[w.name].UID), "a new pod of %s", w.ref())
		c.maExpectPlaced(pod, w)
		volume := pod.Spec.Volumes[0]
		if w.pv == "" {
			gomega.Expect(volume.FlexVolume).To(gomega.BeNil(), "the flexVolume of %s's pod", w.ref())
			gomega.Expect(volume.CSI).NotTo(gomega.BeNil(), "the inline csi volume of %s's pod", w.ref())
			gomega.Expect(volume.CSI.Driver).To(gomega.Equal(w.csiDriver), "the driver of %s's inline volume", w.ref())
			gomega.Expect(volume.CSI.VolumeAttributes).To(gomega.Equal(inline[w.name].FlexVolume.Options), "the attributes of %s's inline volume", w.ref())
		}
		target := c.maCSITarget(pod, w)
		gomega.Expect(MountCount(target)).To(gomega.Equal(1), "%s's volume mounted by kubelet's CSI plugin at %s", w.ref(), target)
		if w.flexDriver == loopDriver {
			WaitFor(ctx, 60*time.Second, w.pv+" attached to "+c.Node+" through a VolumeAttachment", c.attachedOnlyTo(w.pv, c.Node))
		}
		data[w.name] = c.maExpectKept(ctx, w, pod, data[w.name], "on CSI")
		pods[w.name] = pod
	}
	maExpectSummary(done, workloads, current.output())
	for _, u := range done.Units {
		summary.Printf("migrate_apply: %s: down %.1f s while migrated with kills (the time includes its kills and resumes)",
			u.title(), *u.DowntimeSeconds)
	}

	ginkgo.By("--rollback --yes, to the end: every PV back on FlexVolume, every workload Ready through kubelet's FlexVolume plugin with its data")
	// Killed once too, as the last unit's rollback begins, and resumed.
	current = c.maStart(ctx, "rollback", "--rollback", "--yes", "-o", "json")
	where := c.maKillAt(ctx, current, maTarget{maLoop, "rolling-back", false})
	summary.Printf("migrate_apply: rollback killed %s; the journal: %s", where, c.maMustJournal(ctx).steps())
	summary.Printf("migrate_apply: rollback killed: %s", c.maExpectNothingLost(ctx))
	rollbackCtx, cancel := context.WithTimeout(ctx, maRunTimeout)
	defer cancel()
	rolledBack, err := Run(rollbackCtx, flexd, c.maArgs("--resume", "--yes")...)
	c.WriteRun("migrate-apply-rollback.out", rolledBack)
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "flexd migrate --resume --yes of the rollback")
	for _, w := range workloads {
		// The bare Pod's line says it was created again.
		recreated := ""
		if w.bare() {
			recreated = ` \(created again\)`
		}
		line := regexp.MustCompile(`^` + regexp.QuoteMeta(w.ref()) + `: rolled back` + recreated + `, down [0-9]+(\.[0-9]+)? s$`)
		gomega.Expect(slices.ContainsFunc(LogLines(rolledBack), line.MatchString)).To(gomega.BeTrue(),
			"a line /%s/ in what --rollback printed:\n%s", line, rolledBack)
	}
	downLine := regexp.MustCompile(`: rolled back( \(created again\))?, down `)
	for _, l := range LogLines(rolledBack) {
		if downLine.MatchString(l) {
			summary.Printf("migrate_apply: %s", l)
		}
	}
	j = c.maMustJournal(ctx)
	gomega.Expect(j.Operation).To(gomega.Equal("rollback"), "the journal's operation")
	gomega.Expect(j.Finished).To(gomega.BeTrue(), "the journal finished:\n%s", j.text)
	gomega.Expect(j.Units).To(gomega.HaveLen(len(workloads)), "the journal's units:\n%s", j.text)
	for _, u := range j.Units {
		gomega.Expect(u.Step).To(gomega.Equal("rolled-back"), "the step of %s:\n%s", u.title(), j.text)
	}
	for _, w := range workloads {
		if w.pv == "" {
			continue
		}
		pv, err := c.Kube.CoreV1().PersistentVolumes().Get(ctx, w.pv, metav1.GetOptions{})
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
		old := before[w.pv]
		gomega.Expect(pv.Spec.CSI).To(gomega.BeNil(), "PV %s's csi after the rollback", w.pv)
		gomega.Expect(pv.Spec.FlexVolume).To(gomega.Equal(old.Spec.FlexVolume), "PV %s's flexVolume after the rollback", w.pv)
		gomega.Expect(pv.Spec.ClaimRef).NotTo(gomega.BeNil(), "PV %s's claimRef", w.pv)
		gomega.Expect([]string{pv.Spec.ClaimRef.Namespace, pv.Spec.ClaimRef.Name, string(pv.Spec.ClaimRef.UID)}).To(
			gomega.Equal([]string{old.Spec.ClaimRef.Namespace, old.Spec.ClaimRef.Name, string(old.Spec.ClaimRef.UID)}), "PV %s's claimRef", w.pv)
		c.WaitClaimBound(ctx, w.pv, 120*time.Second)
	}
	for _, w := range workloads {
		pod := c.maPod(ctx, w, 300*time.Second)
		gomega.Expect(pod.UID).NotTo(gomega.Equal(pods[w.name].UID), "a new pod of %s", w.ref())
		c.maExpectPlaced(pod, w)
		if w.pv == "" {
			gomega.Expect(pod.Spec.Volumes[0].VolumeSource).To(gomega.Equal(inline[w.name]), "the inline volume of %s's pod after the rollback", w.ref())
		}
		target := c.maFlexTarget(pod, w)
		gomega.Expect(MountCount(target)).To(gomega.Equal(1), "%s's volume mounted by kubelet's FlexVolume plugin at %s", w.ref(), target)
		if w.flexDriver == loopDriver {
			WaitFor(ctx, 60*time.Second, w.pv+" attached to "+c.Node+" by kube-controller-manager", c.flexAttachedTo(w.pv, c.Node))
			c.waitDetached(ctx, w.pv, 60*time.Second)
		}
		data[w.name] = c.maExpectKept(ctx, w, pod, data[w.name], "after the rollback")
		pods[w.name] = pod
	}

	ginkgo.By("--apply --all --recreate-pods --yes once more, not interrupted: each workload's downtime, everything on CSI with its data")
	final := c.maStart(ctx, "apply-again", "--apply", "--all", "--recreate-pods", "--yes", "-o", "json")
	c.maWait(ctx, final, maRunTimeout)
	_, again := maEvents(final.stdout.String())
	gomega.Expect(again).NotTo(gomega.BeNil(), "a summary event:\n%s", final.output())
	maExpectSummary(again, workloads, final.output())
	for _, u := range again.Units {
		summary.Printf("migrate_apply: %s: down %.1f s while migrated in one run", u.title(), *u.DowntimeSeconds)
	}
	for _, w := range workloads {
		pod := c.maPod(ctx, w, 300*time.Second)
		gomega.Expect(pod.UID).NotTo(gomega.Equal(pods[w.name].UID), "a new pod of %s", w.ref())
		c.maExpectPlaced(pod, w)
		if w.pv == "" {
			volume := pod.Spec.Volumes[0]
			gomega.Expect(volume.CSI).NotTo(gomega.BeNil(), "the inline csi volume of %s's pod migrated again", w.ref())
			gomega.Expect(volume.CSI.Driver).To(gomega.Equal(w.csiDriver), "the driver of %s's inline volume", w.ref())
		}
		target := c.maCSITarget(pod, w)
		gomega.Expect(MountCount(target)).To(gomega.Equal(1), "%s's volume mounted by kubelet's CSI plugin at %s", w.ref(), target)
		c.maExpectKept(ctx, w, pod, data[w.name], "migrated again")
	}
}
