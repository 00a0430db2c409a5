package scenarios

// The Kubernetes objects the scenarios make, as typed objects, each deleted when its scenario
// ends (passed or failed), and the waits on them.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// The namespace of the scenarios' pods and claims.
const podNamespace = "default"

// ToolsPod is a pod on node 0 running script in busybox with volume at /data; it prints
// DONE when the script has run, then sleeps. hostNetwork: it needs no address. On node 0 (by
// its hostname label, still through the scheduler) whatever the number of nodes: the scenarios
// look for its mounts in the host's mount namespace, which is node 0's.
func (c *Cluster) ToolsPod(name, script string, volume corev1.VolumeSource, security *corev1.PodSecurityContext) *corev1.Pod {
	return c.ToolsPodOn(c.Node, name, script, volume, security)
}

// ToolsPodOn is ToolsPod on the node.
func (c *Cluster) ToolsPodOn(node, name, script string, volume corev1.VolumeSource, security *corev1.PodSecurityContext) *corev1.Pod {
	if security == nil {
		security = &corev1.PodSecurityContext{}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNamespace},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": node},
			HostNetwork:                   true,
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			SecurityContext:               security,
			Containers: []corev1.Container{{
				Name:            "main",
				Image:           c.ToolsImage,
				ImagePullPolicy: corev1.PullNever,
				// The script as an argument of sh -c: no quoting of it anywhere.
				Command:      []string{"/bin/sh", "-c", script + "\necho DONE; exec sleep 3600"},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: volume}},
		},
	}
}

// ClaimVolume is a pod volume of the claim.
func ClaimVolume(claim string) corev1.VolumeSource {
	return corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}
}

// InlineCSIVolume is a CSI ephemeral inline volume of the driver.
func InlineCSIVolume(driver string, attributes map[string]string) corev1.VolumeSource {
	return corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: driver, VolumeAttributes: attributes}}
}

// InlineFlexVolume is a FlexVolume inline volume: kubelet's own FlexVolume plugin mounts it.
func InlineFlexVolume(driver string, options map[string]string) corev1.VolumeSource {
	return corev1.VolumeSource{FlexVolume: &corev1.FlexVolumeSource{Driver: driver, Options: options}}
}

// CreatePod creates the pod and deletes it when the scenario ends.
func (c *Cluster) CreatePod(ctx context.Context, pod *corev1.Pod) *corev1.Pod {
	ginkgo.GinkgoHelper()
	created, err := c.Kube.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "creating pod %s", pod.Name)
	ginkgo.DeferCleanup(c.DeletePodIfThere, pod.Name)
	return created
}

// RunPod creates the pod, waits until it is Ready and its script has run, and returns its log
// (without the DONE line), also written to run/NAME.log.
func (c *Cluster) RunPod(ctx context.Context, pod *corev1.Pod, timeout time.Duration) string {
	ginkgo.GinkgoHelper()
	c.CreatePod(ctx, pod)
	return c.PodScriptLog(ctx, pod.Name, timeout)
}

// PodScriptLog waits until the pod is Ready and its script has run, and returns its log.
func (c *Cluster) PodScriptLog(ctx context.Context, name string, timeout time.Duration) string {
	ginkgo.GinkgoHelper()
	c.WaitPodReady(ctx, name, timeout)
	return c.ScriptLog(ctx, name, 60*time.Second)
}

// ScriptLog waits up to timeout until the script of a pod that is Ready has run (its DONE
// line), and returns its log without the DONE line, also written to run/NAME.log.
func (c *Cluster) ScriptLog(ctx context.Context, name string, timeout time.Duration) string {
	ginkgo.GinkgoHelper()
	var log string
	WaitFor(ctx, timeout, "pod "+name+"'s script", func(ctx context.Context) error {
		out, err := c.Kube.CoreV1().Pods(podNamespace).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return err
		}
		log = string(out)
		if !strings.HasSuffix(log, "DONE\n") && !strings.Contains(log, "\nDONE\n") && log != "DONE\n" {
			return fmt.Errorf("no DONE in its log yet:\n%s", log)
		}
		return nil
	})
	log = strings.Replace(log, "DONE\n", "", 1)
	c.WriteRun(name+".log", log)
	fmt.Fprintf(ginkgo.GinkgoWriter, "pod %s's log:\n%s", name, log)
	return log
}

// WaitPodReady waits until the pod's Ready condition is True.
func (c *Cluster) WaitPodReady(ctx context.Context, name string, timeout time.Duration) {
	ginkgo.GinkgoHelper()
	WaitFor(ctx, timeout, "pod "+name+" Ready", func(ctx context.Context) error {
		pod, err := c.Kube.CoreV1().Pods(podNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !PodReady(pod) {
			return fmt.Errorf("pod %s is %s, not Ready: %v", name, pod.Status.Phase, pod.Status.Conditions)
		}
		return nil
	})
}

// PodReady says whether the pod's Ready condition is True.
func PodReady(pod *corev1.Pod) bool {
	for _, condition := range pod.Status.Conditions {
		if condition.Type == corev1.PodReady {
			return condition.Status == corev1.ConditionTrue
		}
	}
	return false
}

// LogLines are the lines of a log, for exact-line expectations (grep -x).
func LogLines(log string) []string {
	return strings.Split(strings.TrimRight(log, "\n"), "\n")
}

// firstLine is the first line of a log.
func firstLine(log string) string { return LogLines(log)[0] }

// cut is the first n characters of s (cut -c1-N), for a message quoted in a summary.
func cut(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n])
	}
	return s
}

// DeletePod deletes the pod and waits until it is gone.
func (c *Cluster) DeletePod(ctx context.Context, name string) {
	ginkgo.GinkgoHelper()
	err := c.Kube.CoreV1().Pods(podNamespace).Delete(ctx, name, metav1.DeleteOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "deleting pod %s", name)
	c.waitPodGone(ctx, name, 120*time.Second)
}

// DeletePodIfThere is the cleanup of CreatePod: the pod gone, if it is still there.
func (c *Cluster) DeletePodIfThere(ctx context.Context, name string) {
	err := c.Kube.CoreV1().Pods(podNamespace).Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "deleting pod %s", name)
	c.waitPodGone(ctx, name, 180*time.Second)
}

func (c *Cluster) waitPodGone(ctx context.Context, name string, timeout time.Duration) {
	ginkgo.GinkgoHelper()
	WaitFor(ctx, timeout, "pod "+name+" to go", func(ctx context.Context) error {
		_, err := c.Kube.CoreV1().Pods(podNamespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("pod %s is still there", name)
	})
}

// PodUID is the pod's UID (its dir under kubelet's pods/).
func (c *Cluster) PodUID(ctx context.Context, name string) string {
	ginkgo.GinkgoHelper()
	pod, err := c.Kube.CoreV1().Pods(podNamespace).Get(ctx, name, metav1.GetOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	return string(pod.UID)
}

// CSISource is a CSI PersistentVolume source of the driver.
func CSISource(driver, handle string, attributes map[string]string) corev1.PersistentVolumeSource {
	return corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle, VolumeAttributes: attributes}}
}

// FlexSource is a FlexVolume PersistentVolume source: kubelet's own FlexVolume plugin serves it.
func FlexSource(driver string, options map[string]string) corev1.PersistentVolumeSource {
	return corev1.PersistentVolumeSource{FlexVolume: &corev1.FlexPersistentVolumeSource{Driver: driver, Options: options}}
}

// PersistentVolume is a PV of size with the source, Retain, to be bound to the claim of its name.
func PersistentVolume(name, size string, source corev1.PersistentVolumeSource) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        source,
		},
	}
}

// StaticClaim is a PV and a claim bound to it, made and Bound; both are deleted when the
// scenario ends.
func (c *Cluster) StaticClaim(ctx context.Context, pv *corev1.PersistentVolume) {
	ginkgo.GinkgoHelper()
	_, err := c.Kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "creating PV %s", pv.Name)
	ginkgo.DeferCleanup(c.DeletePVIfThere, pv.Name)
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: pv.Name, Namespace: podNamespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To(""),
			VolumeName:       pv.Name,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: pv.Spec.Capacity[corev1.ResourceStorage]}},
		},
	}
	_, err = c.Kube.CoreV1().PersistentVolumeClaims(podNamespace).Create(ctx, claim, metav1.CreateOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "creating claim %s", claim.Name)
	// Runs before the PV's deletion (cleanups run last in, first out).
	ginkgo.DeferCleanup(c.DeleteClaimIfThere, claim.Name)
	c.WaitClaimBound(ctx, claim.Name, 60*time.Second)
}

// WaitClaimBound waits until the claim is Bound.
func (c *Cluster) WaitClaimBound(ctx context.Context, name string, timeout time.Duration) {
	ginkgo.GinkgoHelper()
	WaitFor(ctx, timeout, "claim "+name+" Bound", func(ctx context.Context) error {
		claim, err := c.Kube.CoreV1().PersistentVolumeClaims(podNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if claim.Status.Phase != corev1.ClaimBound {
			return fmt.Errorf("claim %s is %s", name, claim.Status.Phase)
		}
		return nil
	})
}

// CreateClaim creates a ReadWriteOnce claim of the StorageClass for size (e.g. "16Mi").
func (c *Cluster) CreateClaim(ctx context.Context, name, class, size string) {
	ginkgo.GinkgoHelper()
	_, err := c.Kube.CoreV1().PersistentVolumeClaims(podNamespace).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: ptr.To(class),
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: resource.MustParse(size),
			}},
		},
	}, metav1.CreateOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "creating claim %s", name)
}

// DeleteClaimIfThere deletes the claim, if it is there, and waits until it is gone.
func (c *Cluster) DeleteClaimIfThere(ctx context.Context, name string) {
	err := c.Kube.CoreV1().PersistentVolumeClaims(podNamespace).Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "deleting claim %s", name)
	WaitFor(ctx, 120*time.Second, "claim "+name+" to go", func(ctx context.Context) error {
		_, err := c.Kube.CoreV1().PersistentVolumeClaims(podNamespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("claim %s is still there (%v)", name, err)
	})
}

// DeletePVIfThere deletes the PV, if it is there, and waits until it is gone; a FlexVolume PV
// whose plugin is gone keeps its finalizer, which is removed.
func (c *Cluster) DeletePVIfThere(ctx context.Context, name string) {
	err := c.Kube.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "deleting PV %s", name)
	WaitFor(ctx, 60*time.Second, "PV "+name+" to go", func(ctx context.Context) error {
		pv, err := c.Kube.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if len(pv.Finalizers) > 0 {
			pv.Finalizers = nil
			_, _ = c.Kube.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{})
		}
		return fmt.Errorf("PV %s is still there", name)
	})
}

// PodEvents are the events of the pod (this very pod: by UID, not an earlier one of its name)
// with the reason, oldest first as the API server lists them.
func (c *Cluster) PodEvents(ctx context.Context, pod *corev1.Pod, reason string) ([]corev1.Event, error) {
	selector := fmt.Sprintf("involvedObject.name=%s,involvedObject.uid=%s,reason=%s", pod.Name, pod.UID, reason)
	events, err := c.Kube.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{FieldSelector: selector})
	if err != nil {
		return nil, err
	}
	return events.Items, nil
}

// FailedMount is the message of the pod's last FailedMount event, "" when it has none.
func (c *Cluster) FailedMount(ctx context.Context, pod *corev1.Pod) string {
	ginkgo.GinkgoHelper()
	events, err := c.PodEvents(ctx, pod, "FailedMount")
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "the FailedMount events of pod %s", pod.Name)
	if len(events) == 0 {
		return ""
	}
	return events[len(events)-1].Message
}

// GetPod is the pod as the API server has it now.
func (c *Cluster) GetPod(ctx context.Context, name string) *corev1.Pod {
	ginkgo.GinkgoHelper()
	pod, err := c.Kube.CoreV1().Pods(podNamespace).Get(ctx, name, metav1.GetOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "getting pod %s", name)
	return pod
}
