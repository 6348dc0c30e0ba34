// Copyright (c) k3s_gpu.nvidia contributors
// GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
// SPDX-License-Identifier: GPL-3.0-or-later

// dra-plugin-testdouble: a TEST DOUBLE of NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu v0.4.1, its GPU
// kubelet plugin) for the cluster lab (scripts/cluster-lab.sh). It is not NVIDIA's driver and touches no GPU. It runs
// as a plain process against a kubeconfig and speaks kubelet's real DRA API through the kubeletplugin helper of
// k8s.io/dynamic-resource-allocation (registration in --plugin-registration-path, the DRA gRPC services v1 and
// v1beta1 on dra.sock in --plugin-data-dir: kubelets 1.34 and 1.36 both take either). What the API sees is NVIDIA's
// contract:
//
//	ResourceSlice  driver gpu.nvidia.com, one pool named after the node, devices gpu-<i> with the attributes NVIDIA's
//	               driver publishes (unqualified, in the driver's domain: type "gpu", uuid, productName, brand,
//	               architecture, cudaComputeCapability, cudaDriverVersion, driverVersion, index, minor,
//	               addressingMode; resource.kubernetes.io/pciBusID) and capacity memory
//	Prepare        a transient CDI spec <cdi-dir>/k8s.gpu.nvidia.com-claim_<claimUID>.json, kind
//	               k8s.gpu.nvidia.com/claim, one device <claimUID>-gpu-<i> per allocated device (its deviceNode
//	               /dev/nvidia<i> is <device-node-dir>/nvidia<i>, the lab's fake character device), claim-wide edits
//	               NVIDIA_VISIBLE_DEVICES=void plus --extra-device-nodes and --mount; kubelet gets the CDI IDs
//	               k8s.gpu.nvidia.com/claim=<claimUID>-gpu-<i>
//	Unprepare      removes that claim's spec file
//
// SIGTERM/SIGINT stop the helper (its sockets go; kubelet wipes the node's slices of a driver that stays away).
package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/utils/ptr"
)

const (
	banner     = "TEST DOUBLE of NVIDIA's DRA driver: not NVIDIA's driver, touches no GPU"
	cdiVersion = "0.6.0" // hostPath on device nodes needs 0.5.0; 0.6.0 is what containerd 2.x's CDI reads at least
	cdiVendor  = "k8s.gpu.nvidia.com"
	cdiClass   = "claim"
	cdiKind    = cdiVendor + "/" + cdiClass
)

// The CDI spec, as far as this double writes it (tags.cncf.io/container-device-interface/specs-go field names).
type cdiSpec struct {
	Version        string         `json:"cdiVersion"`
	Kind           string         `json:"kind"`
	Devices        []cdiDevice    `json:"devices"`
	ContainerEdits cdiEdits       `json:"containerEdits,omitempty"`
	Annotations    map[string]any `json:"annotations,omitempty"`
}

type cdiDevice struct {
	Name           string   `json:"name"`
	ContainerEdits cdiEdits `json:"containerEdits"`
}

type cdiEdits struct {
	Env         []string        `json:"env,omitempty"`
	DeviceNodes []cdiDeviceNode `json:"deviceNodes,omitempty"`
	Mounts      []cdiMount      `json:"mounts,omitempty"`
}

type cdiDeviceNode struct {
	Path     string `json:"path"`
	HostPath string `json:"hostPath,omitempty"`
	Type     string `json:"type,omitempty"`
	Major    int64  `json:"major,omitempty"`
	Minor    int64  `json:"minor,omitempty"`
}

type cdiMount struct {
	HostPath      string   `json:"hostPath"`
	ContainerPath string   `json:"containerPath"`
	Options       []string `json:"options,omitempty"`
}

// hostContainer is one HOST:CONTAINER pair of a repeatable flag.
type hostContainer struct{ host, container string }

type mountFlag []hostContainer

func (m *mountFlag) String() string {
	parts := make([]string, 0, len(*m))
	for _, pair := range *m {
		parts = append(parts, pair.host+":"+pair.container)
	}
	return strings.Join(parts, ",")
}

func (m *mountFlag) Set(value string) error {
	host, container, ok := strings.Cut(value, ":")
	if !ok || !filepath.IsAbs(host) || !filepath.IsAbs(container) {
		return fmt.Errorf("want HOST:CONTAINER, two absolute paths, not %q", value)
	}
	*m = append(*m, hostContainer{filepath.Clean(host), filepath.Clean(container)})
	return nil
}

type driver struct {
	name         string
	node         string
	devices      int
	memory       resource.Quantity
	cdiDir       string
	deviceDir    string
	extraDevices []hostContainer
	mounts       []hostContainer
	cancel       context.CancelCauseFunc
}

// uuid is the device's NVIDIA-style UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx), the same for a node and index.
func (d *driver) uuid(index int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("k3s-gpu-dra-testdouble/%s/%d", d.node, index)))
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
}

func deviceName(index int) string { return "gpu-" + strconv.Itoa(index) }

// slice is the one pool this node publishes: gpu-0..gpu-<N-1>, attributes as NVIDIA's driver names and types them.
func (d *driver) slice() resourceslice.DriverResources {
	devices := make([]resourceapi.Device, 0, d.devices)
	for i := 0; i < d.devices; i++ {
		devices = append(devices, resourceapi.Device{
			Name: deviceName(i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"type":                            {StringValue: ptr.To("gpu")},
				"uuid":                            {StringValue: ptr.To(d.uuid(i))},
				"productName":                     {StringValue: ptr.To("NVIDIA Lab Test Double")},
				"brand":                           {StringValue: ptr.To("Nvidia")},
				"architecture":                    {StringValue: ptr.To("Hopper")},
				"cudaComputeCapability":           {VersionValue: ptr.To("9.0.0")},
				"cudaDriverVersion":               {VersionValue: ptr.To("12.8.0")},
				"driverVersion":                   {VersionValue: ptr.To("580.95.5")},
				"index":                           {IntValue: ptr.To(int64(i))},
				"minor":                           {IntValue: ptr.To(int64(i))},
				"addressingMode":                  {StringValue: ptr.To("None")},
				"resource.kubernetes.io/pciBusID": {StringValue: ptr.To(fmt.Sprintf("0000:%02x:00.0", i))},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: d.memory},
			},
		})
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		d.node: {Slices: []resourceslice.Slice{{Devices: devices}}},
	}}
}

func (d *driver) specPath(claimUID types.UID) string {
	return filepath.Join(d.cdiDir, fmt.Sprintf("%s-%s_%s.json", cdiVendor, cdiClass, claimUID))
}

// deviceNode is a CDI device node for HOST mounted at CONTAINER: a character or block device gets its type, major
// and minor from the host's node (as the lab's own spec writes them), a missing one is an error.
func deviceNode(host, container string) (cdiDeviceNode, error) {
	var st unix.Stat_t
	if err := unix.Stat(host, &st); err != nil {
		return cdiDeviceNode{}, fmt.Errorf("device node %s: %w", host, err)
	}
	node := cdiDeviceNode{Path: container, HostPath: host}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		node.Type = "c"
	case unix.S_IFBLK:
		node.Type = "b"
	default:
		return node, nil
	}
	node.Major, node.Minor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
	return node, nil
}

func (d *driver) deviceIndex(name string) (int, error) {
	index, err := strconv.Atoi(strings.TrimPrefix(name, "gpu-"))
	if !strings.HasPrefix(name, "gpu-") || err != nil || index < 0 || index >= d.devices || deviceName(index) != name {
		return 0, fmt.Errorf("unknown device %q (this node has gpu-0..gpu-%d)", name, d.devices-1)
	}
	return index, nil
}

// PrepareResourceClaims writes one transient CDI spec per claim and returns its devices' CDI IDs.
func (d *driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	result := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		prepared, err := d.prepare(claim)
		if err != nil {
			log.Printf("prepare claim %s/%s (%s): FAILED: %v", claim.Namespace, claim.Name, claim.UID, err)
			result[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		result[claim.UID] = kubeletplugin.PrepareResult{Devices: prepared}
	}
	return result, nil
}

func (d *driver) prepare(claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	spec := cdiSpec{Version: cdiVersion, Kind: cdiKind, Devices: []cdiDevice{}, ContainerEdits: cdiEdits{
		Env: []string{"NVIDIA_VISIBLE_DEVICES=void"}, // as NVIDIA's driver: the devices come from CDI, not the hook
	}}
	for _, extra := range d.extraDevices {
		node, err := deviceNode(extra.host, extra.container)
		if err != nil {
			return nil, err
		}
		spec.ContainerEdits.DeviceNodes = append(spec.ContainerEdits.DeviceNodes, node)
	}
	for _, mount := range d.mounts {
		spec.ContainerEdits.Mounts = append(spec.ContainerEdits.Mounts, cdiMount{
			HostPath: mount.host, ContainerPath: mount.container, Options: []string{"ro", "nosuid", "nodev", "bind"},
		})
	}
	var prepared []kubeletplugin.Device
	var names []string
	seen := map[string]bool{}
	for _, allocated := range claim.Status.Allocation.Devices.Results {
		if allocated.Driver != d.name {
			continue
		}
		if allocated.Pool != d.node {
			return nil, fmt.Errorf("device %s/%s is not in this node's pool %s", allocated.Pool, allocated.Device, d.node)
		}
		index, err := d.deviceIndex(allocated.Device)
		if err != nil {
			return nil, err
		}
		cdiName := fmt.Sprintf("%s-%s", claim.UID, allocated.Device)
		if !seen[cdiName] {
			seen[cdiName] = true
			node, err := deviceNode(filepath.Join(d.deviceDir, "nvidia"+strconv.Itoa(index)), "/dev/nvidia"+strconv.Itoa(index))
			if err != nil {
				return nil, err
			}
			spec.Devices = append(spec.Devices, cdiDevice{Name: cdiName, ContainerEdits: cdiEdits{DeviceNodes: []cdiDeviceNode{node}}})
			names = append(names, allocated.Device)
		}
		prepared = append(prepared, kubeletplugin.Device{
			Requests: []string{allocated.Request}, PoolName: allocated.Pool, DeviceName: allocated.Device,
			CDIDeviceIDs: []string{cdiKind + "=" + cdiName},
		})
	}
	if len(spec.Devices) == 0 {
		log.Printf("prepare claim %s/%s (%s): no device of %s allocated, nothing to write", claim.Namespace, claim.Name, claim.UID, d.name)
		return []kubeletplugin.Device{}, nil
	}
	path := d.specPath(claim.UID)
	if err := writeAtomic(path, spec); err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(prepared))
	for _, device := range prepared {
		ids = append(ids, device.CDIDeviceIDs...)
	}
	log.Printf("prepare claim %s/%s (%s): devices %s -> CDI %s (spec %s)", claim.Namespace, claim.Name, claim.UID,
		strings.Join(names, ","), strings.Join(ids, ","), path)
	return prepared, nil
}

// writeAtomic writes the spec whole: a temporary file in the same directory, then rename (containerd watches the dir).
func writeAtomic(path string, spec cdiSpec) error {
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("write CDI spec: %w", err)
	}
	defer os.Remove(tmp.Name()) // gone after the rename; left only on failure
	if _, err = tmp.Write(append(data, '\n')); err == nil {
		err = tmp.Chmod(0o644)
	}
	if closeErr := tmp.Close(); err == nil {
		err = closeErr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write CDI spec %s: %w", path, err)
	}
	return nil
}

// UnprepareResourceClaims removes each claim's spec file; a claim never prepared (or unprepared already) is no error.
func (d *driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	result := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		path := d.specPath(claim.UID)
		var names []string
		if data, err := os.ReadFile(path); err == nil {
			var spec cdiSpec
			if json.Unmarshal(data, &spec) == nil {
				for _, device := range spec.Devices {
					names = append(names, cdiKind+"="+device.Name)
				}
			}
		}
		err := os.Remove(path)
		switch {
		case err == nil:
			log.Printf("unprepare claim %s (%s): removed %s (CDI %s)", claim.NamespacedName, claim.UID, path, strings.Join(names, ","))
		case errors.Is(err, os.ErrNotExist):
			log.Printf("unprepare claim %s (%s): nothing prepared (%s absent)", claim.NamespacedName, claim.UID, path)
			err = nil
		default:
			log.Printf("unprepare claim %s (%s): FAILED: %v", claim.NamespacedName, claim.UID, err)
		}
		result[claim.UID] = err
	}
	return result, nil
}

// HandleError logs background errors (ResourceSlice publishing, gRPC servers); a fatal one stops the program.
func (d *driver) HandleError(_ context.Context, err error, msg string) {
	if errors.Is(err, kubeletplugin.ErrRecoverable) {
		log.Printf("%s: %v", msg, err)
		return
	}
	log.Printf("%s (fatal): %v", msg, err)
	d.cancel(fmt.Errorf("%s: %w", msg, err))
}

// logCalls logs kubelet's registration answer and which DRA gRPC service (v1 or v1beta1) each call came through.
func logCalls(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if status, ok := req.(*registerapi.RegistrationStatus); ok {
		if status.PluginRegistered {
			log.Printf("kubelet registered the plugin")
		} else {
			log.Printf("kubelet refused the plugin: %s", status.Error)
		}
	} else if strings.Contains(info.FullMethod, "DRAPlugin/") {
		log.Printf("kubelet calls %s", info.FullMethod)
	}
	return handler(ctx, req)
}

func main() {
	flags := flag.CommandLine
	flags.Usage = func() {
		fmt.Fprintf(flags.Output(), "dra-plugin-testdouble: %s.\n"+
			"The cluster lab's stand-in for NVIDIA's GPU kubelet plugin (kubernetes-sigs/dra-driver-nvidia-gpu v0.4.1):\n"+
			"publishes gpu-<i> devices in a ResourceSlice and prepares claims with transient CDI specs naming the\n"+
			"lab's fake /dev/nvidia<i> nodes. Runs as a plain process against a kubeconfig.\n\nFlags:\n", banner)
		flags.PrintDefaults()
	}
	kubeconfig := flags.String("kubeconfig", "", "kubeconfig to reach the API server (default: $KUBECONFIG)")
	nodeName := flags.String("node-name", "", "the node's name: the ResourceSlice's node and pool (required)")
	numDevices := flags.Int("num-devices", 2, "devices to publish: gpu-0..gpu-<N-1> (0..128)")
	memory := flags.String("memory", "80Gi", "each device's memory capacity")
	driverName := flags.String("driver-name", "gpu.nvidia.com", "DRA driver name (NVIDIA's: gpu.nvidia.com)")
	cdiDir := flags.String("cdi-dir", "/var/run/cdi", "where the transient CDI specs go (a dir containerd's cdi_spec_dirs names)")
	deviceDir := flags.String("device-node-dir", "/dev", "host dir of the device nodes nvidia<i> (the lab's fake ones: <lab>/dev)")
	extraDevices := flags.String("extra-device-nodes", "", "comma list of further device nodes for every claim: NAME "+
		"(<device-node-dir>/NAME at /dev/NAME) or HOST:CONTAINER, e.g. nvidiactl,nvidia-uvm (only those that exist)")
	var mounts mountFlag
	flags.Var(&mounts, "mount", "HOST:CONTAINER read-only bind mount for every claim, e.g. the lab's nvidia-smi and "+
		"libnvidia-ml.so.1 test doubles (repeatable)")
	registrationDir := flags.String("plugin-registration-path", kubeletplugin.KubeletRegistryDir,
		"kubelet's plugin registration dir (<kubelet --root-dir>/plugins_registry)")
	dataDir := flags.String("plugin-data-dir", "", "where dra.sock is served (default "+
		kubeletplugin.KubeletPluginsDir+"/<driver-name>, i.e. /var/lib/kubelet/plugins/gpu.nvidia.com)")
	verbosity := flags.Int("v", 0, "klog verbosity of the kubeletplugin helper (6: every gRPC call and response)")
	flag.Parse()

	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.SetPrefix("dra-plugin-testdouble: ")
	log.Print(banner)
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	_ = klogFlags.Set("v", strconv.Itoa(*verbosity))

	capacity, err := resource.ParseQuantity(*memory)
	if *nodeName == "" || *numDevices < 0 || *numDevices > resourceapi.ResourceSliceMaxDevices || err != nil || flags.NArg() != 0 {
		flags.Usage()
		log.Fatalf("usage: --node-name NODE [--num-devices 0..%d] [--memory QUANTITY] [flags]", resourceapi.ResourceSliceMaxDevices)
	}
	if *kubeconfig == "" {
		*kubeconfig = os.Getenv("KUBECONFIG")
	}
	if *dataDir == "" {
		*dataDir = filepath.Join(kubeletplugin.KubeletPluginsDir, *driverName)
	}
	d := &driver{name: *driverName, node: *nodeName, devices: *numDevices, memory: capacity,
		cdiDir: *cdiDir, deviceDir: *deviceDir, mounts: mounts}
	for _, entry := range strings.Split(*extraDevices, ",") {
		entry = strings.TrimSpace(entry)
		switch host, container, ok := strings.Cut(entry, ":"); {
		case entry == "":
		case ok:
			d.extraDevices = append(d.extraDevices, hostContainer{host, container})
		default:
			d.extraDevices = append(d.extraDevices, hostContainer{filepath.Join(*deviceDir, entry), "/dev/" + entry})
		}
	}
	for _, mount := range mounts {
		if _, err := os.Stat(mount.host); err != nil {
			log.Fatalf("--mount %s:%s: %v", mount.host, mount.container, err)
		}
	}
	for i := 0; i < d.devices; i++ {
		if _, err := os.Stat(filepath.Join(d.deviceDir, "nvidia"+strconv.Itoa(i))); err != nil {
			log.Printf("warning: %v (preparing gpu-%d will fail)", err, i)
		}
	}

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		log.Fatalf("kubeconfig %q: %v", *kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		log.Fatalf("client: %v", err)
	}
	for _, dir := range []string{*registrationDir, *dataDir, *cdiDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			log.Fatalf("%v", err)
		}
	}

	// root ends on a fatal error only (its cause says which); ctx on that or on SIGTERM/SIGINT, and the helper's
	// work with it (publishing waits for the API server until then)
	root, cancel := context.WithCancelCause(context.Background())
	d.cancel = cancel
	ctx, stopSignals := signal.NotifyContext(root, syscall.SIGTERM, syscall.SIGINT)
	defer stopSignals()
	helper, err := kubeletplugin.Start(klog.NewContext(ctx, klog.Background()), d,
		kubeletplugin.DriverName(d.name),
		kubeletplugin.NodeName(d.node),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(*registrationDir),
		kubeletplugin.PluginDataDirectoryPath(*dataDir),
		kubeletplugin.GRPCInterceptor(logCalls),
		// the defaults, said out loud: kubelet 1.34 and 1.36 take either service
		kubeletplugin.NodeV1(true), kubeletplugin.NodeV1beta1(true),
	)
	if err != nil {
		log.Fatalf("start the kubeletplugin helper: %v", err)
	}
	log.Printf("serving driver %s for node %s: registration %s/%s-reg.sock, DRA gRPC v1 and v1beta1 on %s/dra.sock, CDI specs in %s",
		d.name, d.node, *registrationDir, d.name, *dataDir, d.cdiDir)
	if err := helper.PublishResources(ctx, d.slice()); err != nil && ctx.Err() == nil {
		helper.Stop()
		log.Fatalf("publish ResourceSlice: %v", err)
	} else if err == nil {
		names := make([]string, 0, d.devices)
		for i := 0; i < d.devices; i++ {
			names = append(names, deviceName(i)+"="+d.uuid(i))
		}
		log.Printf("publishing ResourceSlice: driver %s, pool %s, %d device(s) %s, memory %s each",
			d.name, d.node, d.devices, strings.Join(names, ","), d.memory.String())
	}

	<-ctx.Done()
	helper.Stop()
	if cause := context.Cause(root); cause != nil {
		log.Fatalf("stopped: %v", cause)
	}
	log.Printf("stopped (signal): sockets removed; kubelet wipes the node's %s slices once the plugin stays away", d.name)
}
