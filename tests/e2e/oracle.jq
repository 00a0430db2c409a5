# The oracle's comparison (tests/e2e/scenarios/oracle_test.go; docs/oracle.md): the call-outs kubelet and
# kube-controller-manager made through their FlexVolume plugin ($kubelet) against those flexd
# made for the migrated objects (flexd), all in $records as cmd/recorder wrote them.
#
#   jq -n -r --slurpfile records RECORDS.jsonl --arg root "$D" -f oracle.jq
#
# Prints the report; its last line is "oracle: N differences not listed in docs/oracle.md"
# (the scenario passes only with 0).

# --- 1. What differs by nature, normalised here and nowhere else ------------------------------
# The pod's volume dir, the device mount dir and the pod's UID are kubelet's to choose, and
# differ between its FlexVolume and CSI plugins by construction; loop devices are the kernel's.
def normalise:
  gsub($root + "/kubelet/pods/[0-9a-f-]{36}/volumes/(kubernetes\\.io~csi/(?<n>[^/]+)/mount|[^/~]+~[^/]+/(?<m>[^/]+))";
       "<pod-dir>/volumes/\(.n // .m)")
  | gsub($root + "/kubelet/plugins/kubernetes\\.io/(flexvolume/[^/]+/[^/]+/mounts/[^/\"]+|csi/[^/]+/[0-9a-f]{64}/globalmount)";
         "<device-mount-dir>")
  | gsub("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"; "<pod-uid>")
  | gsub("/dev/loop[0-9]+"; "<loop-device>");

# --- 2. What differs and is listed in docs/oracle.md (each rule names its section) -----------
# #inline-volume-name: an inline volume's kubernetes.io/pvOrVolumeName is the pod volume's
# name under FlexVolume and kubelet's `csi-<sha256>` id under CSI.
def listed:
  gsub("\"kubernetes.io/pvOrVolumeName\":\"(csi-[0-9a-f]{64}|inline)\""; "\"kubernetes.io/pvOrVolumeName\":\"<inline-volume-id>\"");

# Who called: kubelet or kube-controller-manager, flexd serve, or something else (`flexd
# migrate` asks init whether a driver attaches), which is not compared.
def side:
  if (.caller | test("^kube (kubelet|kube-controller-manager) ")) then "kubelet"
  elif (.caller | test("^flexd .* serve( |$)")) then "flexd"
  else "other" end;
def kind: .argv[0];
def option($key): (.argv[] | select(startswith("{")) | fromjson | .[$key]) // null;

# The volume a record is about: the pod volume of a target, the PV of the options, the PV a
# device mount dir was mounted for (from this side's mountdevice), detach's name.
def keyed($devices):
  . + {volume: (
    if kind == "mount" or kind == "unmount" then (.argv[1] | normalise | sub(".*/volumes/"; ""))
    elif kind == "unmountdevice" then ($devices[.argv[1]] // "?")
    elif kind == "detach" then .argv[1]
    else option("kubernetes.io/pvOrVolumeName") // "?" end)};

def comparable: {call: (.argv | map(normalise | listed)), exit, stdout: (.stdout | normalise | listed)};

# Each volume's call-outs in order, consecutive repeats (retries) collapsed.
def sequences:
  (map(select(kind == "mountdevice") | {(.argv[1]): option("kubernetes.io/pvOrVolumeName")}) | add // {}) as $devices
  | map(select(kind != "init" and kind != "getvolumename" and kind != "isattached") | keyed($devices))
  | sort_by(.time) | group_by(.driver + " " + .volume)
  | map({key: (.[0].driver + " " + .[0].volume),
         value: (map(comparable) | reduce .[] as $r ([]; if (.[-1] // null) == $r then . else . + [$r] end))})
  | from_entries;

def context($who): map(select(.caller | test($who))) | map({cwd, umask, uid, gid, stdin, mountNamespace}) | unique;

($records | map(select(side == "kubelet"))) as $k
| ($records | map(select(side == "flexd"))) as $f
| ($k | sequences) as $ks | ($f | sequences) as $fs
| [($ks + $fs | keys[]) as $v
   | select($ks[$v] != $fs[$v])
   | "volume \($v):\n  kubelet: \($ks[$v] // [] | map(.call | join(" ")) | join("\n           "))\n  flexd:   \($fs[$v] // [] | map(.call | join(" ")) | join("\n           "))"
   + ([range(0; [($ks[$v] // []), ($fs[$v] // [])] | map(length) | max) as $i
       | select(($ks[$v] // [])[$i] != ($fs[$v] // [])[$i])
       | "\n  call \($i + 1) differs:\n    kubelet \(($ks[$v] // [])[$i] | tojson)\n    flexd   \(($fs[$v] // [])[$i] | tojson)"] | join(""))
  ] as $volume_diffs
# getvolumename (#getvolumename): kubelet runs it before each operation of an attachable volume
# and ignores the answer, flexd once at attach; the same requests and answers, counts aside.
| ([$k[] | select(kind == "getvolumename") | comparable] | unique) as $kg
| ([$f[] | select(kind == "getvolumename") | comparable] | unique) as $fg
# init (#init): kubelet and kube-controller-manager on each probe, flexd once per discovery.
# isattached (#isattached): kube-controller-manager's minutely check of attached volumes, which
# CSI has no call for; taken out of the sequences above, counted in the report.
| ([$k[] | select(kind == "init") | {driver} + comparable] | unique) as $ki
| ([$f[] | select(kind == "init") | {driver} + comparable] | unique) as $fi
# How the driver runs (#environment): the node side in the very same mount namespace, same
# working directory, umask, user and stdin; the environment is each caller's own.
| ($k | context("^kube kubelet ")) as $kn | ($f | context("--mode=node")) as $fn
# The controller's mount namespace is each replica's own: left out, then one entry per context.
| ($k | context("^kube kube-controller-manager ") | map(del(.mountNamespace)) | unique) as $kc
| ($f | context("--mode=controller") | map(del(.mountNamespace)) | unique) as $fc
| [ $volume_diffs[],
    (if $kg != $fg then "getvolumename differs:\n  kubelet \($kg | tojson)\n  flexd   \($fg | tojson)" else empty end),
    (if $ki != $fi then "init differs:\n  kubelet \($ki | tojson)\n  flexd   \($fi | tojson)" else empty end),
    (if $kn != $fn then "node-side execution differs:\n  kubelet \($kn | tojson)\n  flexd   \($fn | tojson)" else empty end),
    (if $kc != $fc then "controller-side execution differs:\n  kube-controller-manager \($kc | tojson)\n  flexd   \($fc | tojson)" else empty end)
  ] as $diffs
| "oracle: \($k | length) call-outs from kubelet and kube-controller-manager, \($f | length) from flexd",
  "volumes compared: \($ks | keys | join(", "))",
  (($ks | to_entries[]) | "  \(.key): \(.value | map(.call[0]) | join(" → "))"),
  "listed, not counted (docs/oracle.md): inline volume names; getvolumename \($k | map(select(kind == "getvolumename")) | length)× vs \($f | map(select(kind == "getvolumename")) | length)×; init \($k | map(select(kind == "init")) | length)× vs \($f | map(select(kind == "init")) | length)×; isattached \($k | map(select(kind == "isattached")) | length)× vs \($f | map(select(kind == "isattached")) | length)×; environment; the controller's mount namespace",
  $diffs[],
  "oracle: \($diffs | length) differences not listed in docs/oracle.md"
