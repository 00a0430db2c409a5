package scenarios

// `flexd migrate` rolling (docs/migration.md#strategies, issue #51): a unit whose PVs are
// ReadWriteMany on a driver that does not attach, and whose workloads keep a pod up, is swapped
// under its running pods, which are then evicted one at a time. Two workloads serve HTTP from a
// shared FlexVolume PV of the hostdir driver each (its dir is under the scratch dir, which every
// node sees): a Deployment and a StatefulSet of 3 replicas, each with a Service and a
// PodDisruptionBudget (maxUnavailable 1). A client per workload does what kube-proxy would (the
// cluster has none): it follows the Service's EndpointSlices and sends a request every 50 ms to
// a ready endpoint, round-robin, from the test process (node 0's network namespace, which
// reaches every node's pods). The plan says rolling for both; --apply and then --rollback must
// not fail one request, nor change a workload's replicas. With E2E_MIGRATE_COMPARE=1 the same
// is measured under --strategy scale-down, for the figures side by side (minutes; CI skips it).

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

const (
	mrWeb      = "e2e-mroll-web" // Deployment, its PV, claim, Service and PodDisruptionBudget
	mrDB       = "e2e-mroll-db"  // StatefulSet, the same
	mrReplicas = 3
	mrPort     = 8080
	// The clients' pace, and how long one request may take.
	mrPace    = 50 * time.Millisecond
	mrTimeout = 2 * time.Second
	// How many failures each client keeps, for the message.
	mrKeep = 10
)

// What a client counts as a failed request when its Service has no ready endpoint.
var errNoEndpoint = errors.New("no ready endpoint")

// Each pod serves /data over HTTP; sh (pid 1) exits on SIGTERM, which httpd as pid 1 would
// ignore (the grace period would then run out on every pod).
const mrServe = `trap 'exit 0' TERM
/bin/busybox httpd -f -p 8080 -h /data &
wait`

// mrWorkload is one of the two workloads, each its own unit: its PV, claim, Service and
// PodDisruptionBudget have its name; its token is in the index.html its pods serve.
type mrWorkload struct{ kind, name, token string }

// ref is the workload as flexd prints it: `Kind namespace/name`.
func (w mrWorkload) ref() string { return w.kind + " " + podNamespace + "/" + w.name }

// mrVolume makes the workload's FlexVolume PV of the hostdir driver, ReadWriteMany, and the
// claim of its name bound to it, and returns the PV once Bound; both go when the scenario
// ends, whichever source the PV has then (its CSI twin has the same name).
func (c *Cluster) mrVolume(ctx context.Context, name string) *corev1.PersistentVolume {
	ginkgo.GinkgoHelper()
	rwx := []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
	pv := PersistentVolume(name, "1Gi", FlexSource(c.Driver, map[string]string{"greeting": "migrate rolling"}))
	pv.Spec.AccessModes = rwx
	_, err := c.Kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "creating PV %s", name)
	ginkgo.DeferCleanup(c.DeletePVIfThere, name)
	_, err = c.Kube.CoreV1().PersistentVolumeClaims(podNamespace).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNamespace},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: rwx, StorageClassName: ptr.To(""), VolumeName: name,
			Resources: corev1.VolumeResourceRequirements{Requests: pv.Spec.Capacity}},
	}, metav1.CreateOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "creating claim %s", name)
	ginkgo.DeferCleanup(c.DeleteClaimIfThere, name) // before the PV's (last in, first out)
	c.WaitClaimBound(ctx, name, 60*time.Second)
	bound, err := c.Kube.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	gomega.Expect(bound.Spec.ClaimRef).NotTo(gomega.BeNil(), "PV %s's claimRef once Bound", name)
	return bound
}

// mrCreate creates the workload's Service, PodDisruptionBudget (maxUnavailable 1) and the
// workload itself: 3 replicas on its claim, spread over the nodes there are. When the scenario
// ends they are deleted, the workload first and its pods waited out.
func (c *Cluster) mrCreate(ctx context.Context, w mrWorkload) {
	ginkgo.GinkgoHelper()
	ginkgo.DeferCleanup(func(ctx context.Context) {
		for what, err := range map[string]error{
			"PodDisruptionBudget": c.Kube.PolicyV1().PodDisruptionBudgets(podNamespace).Delete(ctx, w.name, metav1.DeleteOptions{}),
			"Service":             c.Kube.CoreV1().Services(podNamespace).Delete(ctx, w.name, metav1.DeleteOptions{}),
		} {
			if !apierrors.IsNotFound(err) {
				gomega.Expect(err).NotTo(gomega.HaveOccurred(), "deleting %s %s", what, w.name)
			}
		}
	})
	app := map[string]string{"app": w.name}
	selector := &metav1.LabelSelector{MatchLabels: app}
	meta := metav1.ObjectMeta{Name: w.name, Namespace: podNamespace, Labels: app}
	_, err := c.Kube.CoreV1().Services(podNamespace).Create(ctx, &corev1.Service{ObjectMeta: meta,
		Spec: corev1.ServiceSpec{Selector: app, Ports: []corev1.ServicePort{{Name: "http", Port: mrPort, TargetPort: intstr.FromInt32(mrPort)}}},
	}, metav1.CreateOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "creating Service %s", w.name)
	_, err = c.Kube.PolicyV1().PodDisruptionBudgets(podNamespace).Create(ctx, &policyv1.PodDisruptionBudget{ObjectMeta: meta,
		Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: ptr.To(intstr.FromInt32(1)), Selector: selector},
	}, metav1.CreateOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "creating PodDisruptionBudget %s", w.name)
	template := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: app}, Spec: corev1.PodSpec{
		AutomountServiceAccountToken: ptr.To(false),
		// The preStop's sleep keeps the server up while the endpoint's removal reaches the
		// clients, as every HTTP service behind a Service needs; SIGTERM comes after it.
		TerminationGracePeriodSeconds: ptr.To[int64](10),
		TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: "kubernetes.io/hostname", WhenUnsatisfiable: corev1.ScheduleAnyway, LabelSelector: selector,
		}},
		Containers: []corev1.Container{{
			Name: "main", Image: c.ToolsImage, ImagePullPolicy: corev1.PullNever,
			Command: []string{"/bin/sh", "-c", mrServe},
			Ports:   []corev1.ContainerPort{{Name: "http", ContainerPort: mrPort}},
			ReadinessProbe: &corev1.Probe{PeriodSeconds: 1,
				ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/index.html", Port: intstr.FromInt32(mrPort)}}},
			Lifecycle:    &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/bin/sleep", "3"}}}},
			VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
		}},
		Volumes: []corev1.Volume{{Name: "data", VolumeSource: ClaimVolume(w.name)}},
	}}
	ginkgo.DeferCleanup(func(ctx context.Context) {
		_, err := c.Kubectl(ctx, "delete", strings.ToLower(w.kind), w.name, "--ignore-not-found", "--wait=true", "--timeout=180s")
		gomega.Expect(err).NotTo(gomega.HaveOccurred(), "deleting %s", w.ref())
		WaitFor(ctx, 180*time.Second, "the pods of "+w.ref()+" to go", func(ctx context.Context) error {
			pods, err := c.Kube.CoreV1().Pods(podNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + w.name})
			if err == nil && len(pods.Items) > 0 {
				err = fmt.Errorf("%d pods left", len(pods.Items))
			}
			return err
		})
	})
	if w.kind == "Deployment" {
		_, err = c.Kube.AppsV1().Deployments(podNamespace).Create(ctx, &appsv1.Deployment{ObjectMeta: meta,
			Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](mrReplicas), Selector: selector, Template: template},
		}, metav1.CreateOptions{})
	} else {
		// Every pod on the one claim of the template (no volumeClaimTemplates); all at once.
		_, err = c.Kube.AppsV1().StatefulSets(podNamespace).Create(ctx, &appsv1.StatefulSet{ObjectMeta: meta,
			Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](mrReplicas), ServiceName: w.name, Selector: selector,
				Template: template, PodManagementPolicy: appsv1.ParallelPodManagement},
		}, metav1.CreateOptions{})
	}
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "creating %s", w.ref())
}

// mrWriteIndex writes the workload's index.html (its token) once, through a Running pod of it:
// every pod serves the same shared dir.
func (c *Cluster) mrWriteIndex(ctx context.Context, w mrWorkload) {
	ginkgo.GinkgoHelper()
	WaitFor(ctx, 5*time.Minute, w.ref()+"'s index.html written through one of its pods", func(ctx context.Context) error {
		pods, err := c.Kube.CoreV1().Pods(podNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + w.name})
		if err != nil {
			return err
		}
		var running []string
		for _, pod := range pods.Items {
			if pod.Status.Phase == corev1.PodRunning && pod.DeletionTimestamp == nil {
				running = append(running, pod.Name)
			}
		}
		if len(running) == 0 {
			return fmt.Errorf("no Running pod of %s yet (%d pods)", w.ref(), len(pods.Items))
		}
		slices.Sort(running)
		_, err = c.Kubectl(ctx, "exec", running[0], "--", "/bin/sh", "-c",
			`printf '%s\n' "$1" > /data/.index.html && mv /data/.index.html /data/index.html`, "sh", w.token)
		return err
	})
}

// mrReadyIPs are the addresses of the ready endpoints of the slices, sorted: what kube-proxy
// sends to (an endpoint without the condition counts as ready, as kube-proxy takes it).
func mrReadyIPs(endpointSlices []*discoveryv1.EndpointSlice) []string {
	ips := map[string]bool{}
	for _, s := range endpointSlices {
		for _, e := range s.Endpoints {
			if (e.Conditions.Ready == nil || *e.Conditions.Ready) && len(e.Addresses) > 0 {
				ips[e.Addresses[0]] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(ips))
}

// mrServing waits until the workload serves from 3 Ready pods and no other (none of old, by
// UID), its EndpointSlices list exactly those pods as ready, and its PodDisruptionBudget
// allows one disruption; returns the pods.
func (c *Cluster) mrServing(ctx context.Context, w mrWorkload, old map[string]bool) []corev1.Pod {
	ginkgo.GinkgoHelper()
	var serving []corev1.Pod
	WaitFor(ctx, 5*time.Minute, w.ref()+" serving from 3 new Ready pods", func(ctx context.Context) error {
		pods, err := c.Kube.CoreV1().Pods(podNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + w.name})
		if err != nil {
			return err
		}
		var ips, seen []string
		for _, pod := range pods.Items {
			seen = append(seen, fmt.Sprintf("%s ready=%v deleting=%v old=%v", pod.Name, PodReady(&pod), pod.DeletionTimestamp != nil, old[string(pod.UID)]))
			ips = append(ips, pod.Status.PodIP)
		}
		if len(pods.Items) != mrReplicas || slices.ContainsFunc(pods.Items, func(pod corev1.Pod) bool {
			return !PodReady(&pod) || pod.DeletionTimestamp != nil || old[string(pod.UID)]
		}) {
			return fmt.Errorf("pods of %s: %v", w.ref(), seen)
		}
		list, err := c.Kube.DiscoveryV1().EndpointSlices(podNamespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + w.name})
		if err != nil {
			return err
		}
		var items []*discoveryv1.EndpointSlice
		for i := range list.Items {
			items = append(items, &list.Items[i])
		}
		slices.Sort(ips)
		if ready := mrReadyIPs(items); !slices.Equal(ready, ips) {
			return fmt.Errorf("the ready endpoints of Service %s are %v, its pods' addresses %v", w.name, ready, ips)
		}
		pdb, err := c.Kube.PolicyV1().PodDisruptionBudgets(podNamespace).Get(ctx, w.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if s := pdb.Status; s.ObservedGeneration < pdb.Generation || s.CurrentHealthy != mrReplicas || s.DisruptionsAllowed != 1 {
			return fmt.Errorf("PodDisruptionBudget %s: %d healthy of %d expected, %d disruptions allowed", w.name, s.CurrentHealthy, s.ExpectedPods, s.DisruptionsAllowed)
		}
		serving = pods.Items
		return nil
	})
	return serving
}

// mrGet asks the pod at ip for index.html: nil when it answered 200 with the token.
func mrGet(ctx context.Context, client *http.Client, ip, token string) error {
	url := "http://" + net.JoinHostPort(ip, strconv.Itoa(mrPort)) + "/index.html"
	request, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	response, err := client.Do(request)
	if err != nil {
		return err
	}
	defer func() { _ = response.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(response.Body, 1<<16))
	switch {
	case err != nil:
		return fmt.Errorf("%s: reading the body: %w", ip, err)
	case response.StatusCode != http.StatusOK:
		return fmt.Errorf("%s: %s", ip, response.Status)
	case !strings.Contains(string(body), token):
		return fmt.Errorf("%s: a body without the token: %q", ip, cut(string(body), 80))
	}
	return nil
}

// mrHTTP is the clients' HTTP: no proxy from the environment, a connection per request (a
// kept connection would outlive its endpoint).
func mrHTTP() *http.Client {
	return &http.Client{Timeout: mrTimeout, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
}

// mrStats is what one workload's client counted.
type mrStats struct {
	requests, failed, noEndpoint int
	longestGap                   time.Duration // between two successful replies
	minReplicas                  int32         // the least spec.replicas seen
	failures                     []string      // the first mrKeep
}

// mrClients are the clients of the workloads over one run of flexd migrate.
type mrClients struct {
	cancel  context.CancelFunc
	wait    sync.WaitGroup
	mu      sync.Mutex
	stats   map[string]*mrStats
	started time.Time
	took    time.Duration
	once    sync.Once
	factory informers.SharedInformerFactory
}

// replicas records a Deployment's or StatefulSet's spec.replicas, if it is a workload's.
func (m *mrClients) replicas(obj any) {
	name, replicas := "", ptr.To[int32](1)
	switch o := obj.(type) {
	case *appsv1.Deployment:
		name, replicas = o.Name, cmp.Or(o.Spec.Replicas, replicas)
	case *appsv1.StatefulSet:
		name, replicas = o.Name, cmp.Or(o.Spec.Replicas, replicas)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.stats[name]; s != nil && *replicas < s.minReplicas {
		s.minReplicas = *replicas
	}
}

// mrStartClients starts a client per workload. The endpoints come from an informer (a watch of
// the EndpointSlices: each change seen as it is made, well within 200 ms); every change of the
// workloads' spec.replicas is recorded from others.
func (c *Cluster) mrStartClients(ctx context.Context, workloads []mrWorkload) *mrClients {
	ginkgo.GinkgoHelper()
	// A client of its own: client-go's default 5 requests a second is the waits'.
	config := rest.CopyConfig(c.Config)
	config.QPS, config.Burst = 50, 100
	kube, err := kubernetes.NewForConfig(config)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	ctx, cancel := context.WithCancel(ctx)
	m := &mrClients{cancel: cancel, stats: map[string]*mrStats{}, started: time.Now()}
	for _, w := range workloads {
		m.stats[w.name] = &mrStats{minReplicas: math.MaxInt32}
	}
	// The namespace's objects are the scenarios' few: no selector.
	factory := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithNamespace(podNamespace))
	m.factory = factory
	lister := factory.Discovery().V1().EndpointSlices().Lister()
	handler := cache.ResourceEventHandlerFuncs{AddFunc: m.replicas, UpdateFunc: func(_, obj any) { m.replicas(obj) }}
	for _, informer := range []cache.SharedIndexInformer{factory.Apps().V1().Deployments().Informer(), factory.Apps().V1().StatefulSets().Informer()} {
		_, err := informer.AddEventHandler(handler)
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
	}
	factory.Start(ctx.Done())
	for informer, synced := range factory.WaitForCacheSync(ctx.Done()) {
		gomega.Expect(synced).To(gomega.BeTrue(), "the informer of %v synced", informer)
	}
	client := mrHTTP()
	for _, w := range workloads {
		m.wait.Add(1)
		go func() {
			defer m.wait.Done()
			selector := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: w.name})
			ticker := time.NewTicker(mrPace)
			defer ticker.Stop()
			var last time.Time // of the last success
			for next := 0; ; {
				select {
				case <-ctx.Done():
					return
				case <-ticker.C:
				}
				endpointSlices, _ := lister.EndpointSlices(podNamespace).List(selector)
				failure := errNoEndpoint
				if ips := mrReadyIPs(endpointSlices); len(ips) > 0 {
					failure = mrGet(ctx, client, ips[next%len(ips)], w.token)
					next++
				}
				if ctx.Err() != nil {
					return // cut by the stop: not counted
				}
				now := time.Now()
				m.mu.Lock()
				s := m.stats[w.name]
				s.requests++
				switch {
				case failure != nil:
					s.failed++
					if errors.Is(failure, errNoEndpoint) {
						s.noEndpoint++
					}
					if len(s.failures) < mrKeep {
						s.failures = append(s.failures, fmt.Sprintf("+%.3f s: %v", now.Sub(m.started).Seconds(), failure))
					}
				case !last.IsZero() && now.Sub(last) > s.longestGap:
					s.longestGap = now.Sub(last)
				}
				if failure == nil {
					last = now
				}
				m.mu.Unlock()
			}
		}()
	}
	return m
}

// answered fails until every client has had 5 successful replies.
func (m *mrClients) answered(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, s := range m.stats {
		if s.requests-s.failed < 5 {
			return fmt.Errorf("the client of %s: %d requests, %d failed: %v", name, s.requests, s.failed, s.failures)
		}
	}
	return nil
}

// stop stops the clients (once) and returns what they counted.
func (m *mrClients) stop() map[string]mrStats {
	m.once.Do(func() {
		m.cancel()
		m.wait.Wait()
		m.took = time.Since(m.started)
		m.factory.Shutdown()
	})
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]mrStats{}
	for name, s := range m.stats {
		out[name] = *s
	}
	return out
}

// The summary event of a run with -o json, as far as the scenario reads it.
type mrSummaryEvent struct {
	Operation string          `json:"operation"`
	Units     []mrSummaryUnit `json:"units"`
}

type mrSummaryUnit struct {
	Workloads       []string `json:"workloads"`
	PVs             []string `json:"pvs"`
	Step            string   `json:"step"`
	Strategy        string   `json:"strategy"`
	DowntimeSeconds *float64 `json:"downtime_seconds"`
	PodsReplaced    []string `json:"pods_replaced"`
}

// mrRun is one run of flexd migrate under the clients.
type mrRun struct {
	what    string // "rolling apply", ...
	took    time.Duration
	clients time.Duration // from before flexd started to after the checks that follow it
	stats   map[string]mrStats
	events  []map[string]any
	summary mrSummaryEvent
	output  string
}

// mrMigrate runs `flexd migrate ARGS` as the migrator, to the end, under a client per workload
// started before it; after (the checks of its outcome) runs before the clients stop. The
// figures go to the summary, whatever the outcome.
func (c *Cluster) mrMigrate(ctx context.Context, summary *Summary, workloads []mrWorkload, what string, after func(*mrRun), args ...string) *mrRun {
	ginkgo.GinkgoHelper()
	r := &mrRun{what: what}
	clients := c.mrStartClients(ctx, workloads)
	defer func() {
		r.stats = clients.stop()
		r.clients = clients.took
		for _, w := range workloads {
			s := r.stats[w.name]
			summary.Printf("migrate_rolling: %s (flexd %.1f s): %s: %d requests in %.1f s, %d failed (%d with no ready endpoint), longest gap %.2f s, spec.replicas at least %d",
				what, r.took.Seconds(), w.ref(), s.requests, r.clients.Seconds(), s.failed, s.noEndpoint, s.longestGap.Seconds(), s.minReplicas)
			for _, f := range s.failures {
				summary.Printf("migrate_rolling: %s: %s: failed %s", what, w.ref(), f)
			}
		}
	}()
	WaitFor(ctx, 60*time.Second, "the clients' first replies", clients.answered)
	start := time.Now()
	run := c.maStart(ctx, strings.ReplaceAll(what, " ", "-"), args...)
	c.maWait(ctx, run, maRunTimeout)
	r.took, r.output = time.Since(start), run.output()
	r.events, _ = maEvents(run.stdout.String())
	i := slices.IndexFunc(r.events, func(e map[string]any) bool { return e["event"] == "summary" })
	gomega.Expect(i).To(gomega.BeNumerically(">=", 0), "a summary event from the %s:\n%s", what, r.output)
	text, err := json.Marshal(r.events[i])
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	gomega.Expect(json.Unmarshal(text, &r.summary)).To(gomega.Succeed(), "the summary of the %s: %s", what, text)
	after(r)
	return r
}

// mrExpectUnits fails unless the run's summary has one unit per workload, alone with its PV,
// at step, moved by strategy. Rolling: no downtime, every step event rolling, each workload's
// pods as they were before the run (before) replaced, one replaced event each.
func mrExpectUnits(r *mrRun, workloads []mrWorkload, before map[string][]corev1.Pod, operation, step, strategy string) {
	ginkgo.GinkgoHelper()
	gomega.Expect(r.summary.Operation).To(gomega.Equal(operation), "the operation of the %s:\n%s", r.what, r.output)
	gomega.Expect(r.summary.Units).To(gomega.HaveLen(len(workloads)), "the units of the %s:\n%s", r.what, r.output)
	for _, w := range workloads {
		i := slices.IndexFunc(r.summary.Units, func(u mrSummaryUnit) bool { return slices.Equal(u.Workloads, []string{w.ref()}) })
		gomega.Expect(i).To(gomega.BeNumerically(">=", 0), "a unit of %s alone in the summary of the %s:\n%s", w.ref(), r.what, r.output)
		u := r.summary.Units[i]
		gomega.Expect(u.PVs).To(gomega.Equal([]string{w.name}), "the PVs of %s's unit", w.ref())
		gomega.Expect(u.Step).To(gomega.Equal(step), "the step of %s's unit after the %s", w.ref(), r.what)
		gomega.Expect(u.Strategy).To(gomega.Equal(strategy), "the strategy of %s's unit in the %s", w.ref(), r.what)
		if strategy != "rolling" {
			continue
		}
		gomega.Expect(u.DowntimeSeconds).To(gomega.BeNil(), "the downtime of %s's rolling unit", w.ref())
		var names []string
		for _, pod := range before[w.name] {
			names = append(names, podNamespace+"/"+pod.Name)
		}
		gomega.Expect(u.PodsReplaced).To(gomega.ConsistOf(names), "the pods the %s replaced of %s:\n%s", r.what, w.ref(), r.output)
		replaced := slices.DeleteFunc(slices.Clone(r.events), func(e map[string]any) bool { return e["event"] != "replaced" || e["workload"] != w.ref() })
		gomega.Expect(replaced).To(gomega.HaveLen(mrReplicas), "replaced events of %s in the %s:\n%s", w.ref(), r.what, r.output)
	}
	for _, e := range r.events {
		if e["event"] == "step" {
			gomega.Expect(e["strategy"]).To(gomega.Equal(strategy), "a step event of the %s: %v", r.what, e)
		}
	}
}

// mrExpectVolumes: each workload's PV is the CSI twin (csi) or the FlexVolume PV it was
// (before), with its name and claimRef, its claim Bound; each of its pods mounts it through
// that plugin of kubelet, in its node's mount namespace (a worker's kubelet dir is at node 0's
// path).
func (c *Cluster) mrExpectVolumes(ctx context.Context, workloads []mrWorkload, before map[string]*corev1.PersistentVolume, pods map[string][]corev1.Pod, csi bool) {
	ginkgo.GinkgoHelper()
	for _, w := range workloads {
		pv, err := c.Kube.CoreV1().PersistentVolumes().Get(ctx, w.name, metav1.GetOptions{})
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
		old := before[w.name]
		if csi {
			gomega.Expect(pv.Spec.FlexVolume).To(gomega.BeNil(), "PV %s's flexVolume", w.name)
			gomega.Expect(pv.Spec.CSI).To(gomega.HaveValue(gomega.And(gomega.HaveField("Driver", c.CSIName), gomega.HaveField("VolumeHandle", w.name))), "PV %s's csi", w.name)
		} else {
			gomega.Expect(pv.Spec.CSI).To(gomega.BeNil(), "PV %s's csi", w.name)
			gomega.Expect(pv.Spec.FlexVolume).To(gomega.Equal(old.Spec.FlexVolume), "PV %s's flexVolume", w.name)
		}
		gomega.Expect(pv.Spec.AccessModes).To(gomega.Equal(old.Spec.AccessModes), "PV %s's access modes", w.name)
		gomega.Expect(pv.Spec.ClaimRef).To(gomega.HaveValue(gomega.HaveField("UID", old.Spec.ClaimRef.UID)), "PV %s's claimRef", w.name)
		c.WaitClaimBound(ctx, w.name, 120*time.Second)
		for _, pod := range pods[w.name] {
			target := c.Path("kubelet", "pods", string(pod.UID), "volumes", pluginDirName(c.Driver), w.name)
			if csi {
				target = c.VolumeTarget(string(pod.UID), w.name)
			}
			gomega.Expect(MountsOn(c.NodeNamed(pod.Spec.NodeName))).To(gomega.ContainElement(target),
				"pod %s of %s on %s: its volume mounted at %s", pod.Name, w.ref(), pod.Spec.NodeName, target)
		}
	}
}

// mrExpectNoFailures: no request of the run failed, no replicas changed.
func mrExpectNoFailures(r *mrRun, workloads []mrWorkload) {
	ginkgo.GinkgoHelper()
	for _, w := range workloads {
		s := r.stats[w.name]
		gomega.Expect(s.requests).To(gomega.BeNumerically(">", 0), "requests to %s during the %s", w.ref(), r.what)
		gomega.Expect(s.failed).To(gomega.BeZero(), "failed requests to %s during the %s (of %d; the first: %v)", w.ref(), r.what, s.requests, s.failures)
		gomega.Expect(s.minReplicas).To(gomega.BeEquivalentTo(mrReplicas), "the least spec.replicas of %s during the %s", w.ref(), r.what)
	}
}

// mrPlanUnit is a unit of the plan (-o json), as far as the scenario reads it.
type mrPlanUnit struct {
	Workloads []string `json:"workloads"`
	PVs       []struct {
		Name        string   `json:"name"`
		Attaches    bool     `json:"attaches"`
		AccessModes []string `json:"access_modes"`
	} `json:"pvs"`
	Pods           []string `json:"pods"`
	Strategy       string   `json:"strategy"`
	StrategyReason string   `json:"strategy_reason"`
	Downtime       string   `json:"downtime"`
}

// scenarioMigrateRolling: see the file's comment.
func scenarioMigrateRolling(ctx context.Context) {
	c := cluster
	summary := c.NewSummary("migrate_rolling")
	workloads := []mrWorkload{{kind: "Deployment", name: mrWeb}, {kind: "StatefulSet", name: mrDB}}
	for i := range workloads {
		workloads[i].token = fmt.Sprintf("%s-%d", workloads[i].name, time.Now().UnixNano())
	}

	ginkgo.By("flexd deployed for every installed driver, the hostdir driver on every node's CSINode, the migrator's identity")
	c.ApplyAllManifests(ctx, "flexd-migrate-rolling")
	c.WaitCSINodeLists(ctx, c.CSIName)
	maKubeconfig = c.maMigratorIdentity(ctx)
	// A journal left by an earlier run would make --apply refuse; this one's goes at the end.
	c.deleteMigrationJournal(ctx)
	ginkgo.DeferCleanup(c.deleteMigrationJournal)
	removeDirs := func() {
		for _, w := range workloads {
			gomega.Expect(os.RemoveAll(c.Path("volumes", w.name))).To(gomega.Succeed())
		}
	}
	removeDirs()
	ginkgo.DeferCleanup(removeDirs)

	ginkgo.By("a FlexVolume PV of the hostdir driver per workload, ReadWriteMany, and its claim, Bound")
	before := map[string]*corev1.PersistentVolume{}
	for _, w := range workloads {
		before[w.name] = c.mrVolume(ctx, w.name)
	}

	ginkgo.By("a Deployment and a StatefulSet of 3 replicas serving HTTP from them, each with a Service and a PodDisruptionBudget (maxUnavailable 1)")
	for _, w := range workloads {
		c.mrCreate(ctx, w)
	}

	ginkgo.By("each workload's index.html written through one of its pods: 3 Ready pods on FlexVolume, 3 ready endpoints, each answering its token")
	pods := map[string][]corev1.Pod{}
	for _, w := range workloads {
		c.mrWriteIndex(ctx, w)
	}
	for _, w := range workloads {
		pods[w.name] = c.mrServing(ctx, w, nil)
		var nodes []string
		for _, pod := range pods[w.name] {
			WaitFor(ctx, 60*time.Second, "pod "+pod.Name+" ("+pod.Status.PodIP+") answering from the test process", func(ctx context.Context) error {
				return mrGet(ctx, mrHTTP(), pod.Status.PodIP, w.token)
			})
			nodes = append(nodes, pod.Spec.NodeName)
		}
		summary.Printf("migrate_rolling: %s: pods on %s", w.ref(), strings.Join(nodes, ", "))
	}
	c.mrExpectVolumes(ctx, workloads, before, pods, false)

	ginkgo.By("--plan --all -o json: a unit per workload, each rolling, no downtime")
	planOut := MustRun(ctx, c.Path("bin", "flexd"), c.maArgs("--plan", "--all", "-o", "json")...)
	c.WriteRun("migrate-rolling-plan.json", planOut)
	var plan struct {
		Units   []mrPlanUnit `json:"units"`
		Refused []maRefused  `json:"refused"`
	}
	gomega.Expect(json.Unmarshal([]byte(planOut), &plan)).To(gomega.Succeed(), "the plan, one JSON object:\n%s", planOut)
	gomega.Expect(plan.Refused).To(gomega.BeEmpty(), "refused in the plan:\n%s", planOut)
	gomega.Expect(plan.Units).To(gomega.HaveLen(len(workloads)), "the plan's units:\n%s", planOut)
	for _, w := range workloads {
		i := slices.IndexFunc(plan.Units, func(u mrPlanUnit) bool { return slices.Equal(u.Workloads, []string{w.ref()}) })
		gomega.Expect(i).To(gomega.BeNumerically(">=", 0), "a unit of %s alone in the plan:\n%s", w.ref(), planOut)
		u := plan.Units[i]
		gomega.Expect(u.Strategy).To(gomega.Equal("rolling"), "the strategy of %s's unit (%s):\n%s", w.ref(), u.StrategyReason, planOut)
		gomega.Expect(u.Downtime).To(gomega.HavePrefix("none"), "the downtime of %s's unit:\n%s", w.ref(), planOut)
		gomega.Expect(u.PVs).To(gomega.HaveLen(1), "the PVs of %s's unit:\n%s", w.ref(), planOut)
		gomega.Expect([]any{u.PVs[0].Name, u.PVs[0].Attaches, u.PVs[0].AccessModes}).To(
			gomega.Equal([]any{w.name, false, []string{"ReadWriteMany"}}), "the PV of %s's unit:\n%s", w.ref(), planOut)
		var names []string
		for _, pod := range pods[w.name] {
			names = append(names, podNamespace+"/"+pod.Name)
		}
		gomega.Expect(u.Pods).To(gomega.ConsistOf(names), "the pods of %s's unit:\n%s", w.ref(), planOut)
		summary.Printf("migrate_rolling: the plan: %s: %s: %s; downtime: %s", w.ref(), u.Strategy, u.StrategyReason, u.Downtime)
	}

	// One direction: the run under the clients, its units at step, the PVs on CSI or not, every
	// pod new, Ready and mounting through that plugin, checked before the clients stop.
	migrate := func(what, operation, step, strategy string, csi bool, args ...string) *mrRun {
		ginkgo.GinkgoHelper()
		return c.mrMigrate(ctx, summary, workloads, what, func(r *mrRun) {
			mrExpectUnits(r, workloads, pods, operation, step, strategy)
			for _, w := range workloads {
				old := map[string]bool{}
				for _, pod := range pods[w.name] {
					old[string(pod.UID)] = true
				}
				pods[w.name] = c.mrServing(ctx, w, old)
			}
			c.mrExpectVolumes(ctx, workloads, before, pods, csi)
		}, args...)
	}

	ginkgo.By("--apply --all --yes -o json under the clients, to the end: rolled, every PV its CSI twin, every pod new on CSI, no request failed, no replicas changed")
	apply := migrate("rolling apply", "apply", "done", "rolling", true, "--apply", "--all", "--yes", "-o", "json")
	mrExpectNoFailures(apply, workloads)

	ginkgo.By("--rollback --yes -o json under the clients, to the end: rolled back, every PV on FlexVolume again, every pod new on FlexVolume, no request failed, no replicas changed")
	rollback := migrate("rolling rollback", "rollback", "rolled-back", "rolling", false, "--rollback", "--yes", "-o", "json")
	mrExpectNoFailures(rollback, workloads)

	if os.Getenv("E2E_MIGRATE_COMPARE") != "1" {
		return
	}
	ginkgo.By("E2E_MIGRATE_COMPARE=1: the same with --strategy scale-down, apply and rollback, side by side with rolling")
	scaleApply := migrate("scale-down apply", "apply", "done", "scale-down", true, "--apply", "--all", "--strategy", "scale-down", "--yes", "-o", "json")
	scaleRollback := migrate("scale-down rollback", "rollback", "rolled-back", "scale-down", false, "--rollback", "--yes", "-o", "json")
	for _, pair := range [][2]*mrRun{{apply, scaleApply}, {rollback, scaleRollback}} {
		for _, w := range workloads {
			line := "migrate_rolling: " + strings.TrimPrefix(pair[0].what, "rolling ") + " " + w.ref() + ":"
			for _, r := range pair {
				s := r.stats[w.name]
				line += fmt.Sprintf(" | %s: %d of %d requests failed, longest gap %.2f s, flexd %.1f s",
					strings.Fields(r.what)[0], s.failed, s.requests, s.longestGap.Seconds(), r.took.Seconds())
			}
			summary.Printf("%s", line)
		}
	}
}
