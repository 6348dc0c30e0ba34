// Copyright (c) k3s_gpu.nvidia contributors
// GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
// SPDX-License-Identifier: GPL-3.0-or-later

// device-plugin-testdouble: a TEST DOUBLE of NVIDIA's device plugin for the cluster lab
// (scripts/cluster-lab.sh). It is not NVIDIA's plugin and touches no GPU. It speaks kubelet's real
// device plugin API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1): it registers with kubelet,
// advertises --gpus devices as nvidia.com/gpu (IDs are indices, NVIDIA's deviceIDStrategy=index), and
// answers Allocate as NVIDIA's plugin does for its deviceListStrategy:
//
//	envvar   NVIDIA_VISIBLE_DEVICES=<ids>: the NVIDIA runtime turns it into the devices
//	cdi-cri  CDI device names nvidia.com/gpu=<id> in the CRI request: containerd injects them
//
// The devices behind the IDs are the lab's fake character devices, named by the lab's CDI spec.
//
// Signals: SIGUSR1 marks every device Unhealthy and SIGUSR2 Healthy again (kubelet gets a ListAndWatch update and
// the node's allocatable follows, its capacity stays), as NVIDIA's plugin does on XID errors; SIGTERM/SIGINT stop it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	endpoint = "k3s-gpu-testdouble-nvidia-gpu.sock"
	cdiKind  = "nvidia.com/gpu"
)

type plugin struct {
	api.UnimplementedDevicePluginServer
	gpus     int
	strategy string
	resource string
	stop     chan struct{}

	mu        sync.Mutex
	unhealthy bool          // every device reported Unhealthy (SIGUSR1), Healthy again on SIGUSR2
	changed   chan struct{} // closed (and replaced) when the health changes: each ListAndWatch sends again
}

// health returns the devices' health and the channel that is closed on its next change.
func (p *plugin) health() (string, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.unhealthy {
		return api.Unhealthy, p.changed
	}
	return api.Healthy, p.changed
}

// setHealth marks every device Unhealthy (or Healthy) and wakes every ListAndWatch stream.
func (p *plugin) setHealth(unhealthy bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.unhealthy == unhealthy {
		return
	}
	p.unhealthy = unhealthy
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *plugin) devices(health string) []*api.Device {
	devices := make([]*api.Device, 0, p.gpus)
	for i := 0; i < p.gpus; i++ {
		devices = append(devices, &api.Device{ID: strconv.Itoa(i), Health: health})
	}
	return devices
}

func (p *plugin) GetDevicePluginOptions(context.Context, *api.Empty) (*api.DevicePluginOptions, error) {
	return &api.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *api.Empty, stream grpc.ServerStreamingServer[api.ListAndWatchResponse]) error {
	for {
		health, changed := p.health()
		log.Printf("ListAndWatch: advertising %d %s device(s), %s", p.gpus, p.resource, health)
		if err := stream.Send(&api.ListAndWatchResponse{Devices: p.devices(health)}); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-p.stop:
			return nil
		case <-changed:
		}
	}
}

func (p *plugin) Allocate(_ context.Context, request *api.AllocateRequest) (*api.AllocateResponse, error) {
	response := &api.AllocateResponse{}
	for _, container := range request.ContainerRequests {
		ids := container.DevicesIds
		for _, id := range ids {
			if n, err := strconv.Atoi(id); err != nil || n < 0 || n >= p.gpus {
				return nil, fmt.Errorf("unknown device %q", id)
			}
		}
		allocation := &api.ContainerAllocateResponse{}
		switch p.strategy {
		case "envvar":
			allocation.Envs = map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(ids, ",")}
		case "cdi-cri":
			for _, id := range ids {
				allocation.CdiDevices = append(allocation.CdiDevices, &api.CDIDevice{Name: cdiKind + "=" + id})
			}
		}
		log.Printf("Allocate (%s): devices %v -> envs %v, CDI devices %v", p.strategy, ids, allocation.Envs, allocation.CdiDevices)
		response.ContainerResponses = append(response.ContainerResponses, allocation)
	}
	return response, nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *api.PreferredAllocationRequest) (*api.PreferredAllocationResponse, error) {
	return &api.PreferredAllocationResponse{}, nil
}

func (p *plugin) PreStartContainer(context.Context, *api.PreStartContainerRequest) (*api.PreStartContainerResponse, error) {
	return &api.PreStartContainerResponse{}, nil
}

func register(kubeletSocket, resource string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = api.NewRegistrationClient(conn).Register(ctx, &api.RegisterRequest{
		Version: api.Version, Endpoint: endpoint, ResourceName: resource,
	})
	return err
}

func main() {
	dir := flag.String("device-plugin-dir", "", "kubelet's device-plugins directory (<root-dir>/device-plugins)")
	gpus := flag.Int("gpus", 1, "devices to advertise")
	strategy := flag.String("strategy", "envvar", "deviceListStrategy: envvar or cdi-cri")
	resource := flag.String("resource", cdiKind, "extended resource name")
	flag.Parse()
	log.SetPrefix("device-plugin-testdouble (TEST DOUBLE, not NVIDIA's device plugin): ")
	if *dir == "" || *gpus < 0 || (*strategy != "envvar" && *strategy != "cdi-cri") {
		log.Fatalf("usage: --device-plugin-dir DIR [--gpus N] [--strategy envvar|cdi-cri]")
	}
	socket := filepath.Join(*dir, endpoint)
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	if err != nil {
		log.Fatalf("listen on %s: %v", socket, err)
	}
	p := &plugin{gpus: *gpus, strategy: *strategy, resource: *resource, stop: make(chan struct{}), changed: make(chan struct{})}
	server := grpc.NewServer()
	api.RegisterDevicePluginServer(server, p)
	go func() {
		if err := server.Serve(listener); err != nil {
			log.Printf("serve: %v", err)
		}
	}()
	kubeletSocket := filepath.Join(*dir, "kubelet.sock")
	if err := register(kubeletSocket, *resource); err != nil {
		log.Fatalf("register with kubelet at %s: %v", kubeletSocket, err)
	}
	log.Printf("registered %s with kubelet (%s), %d device(s), strategy %s, socket %s", *resource, kubeletSocket, *gpus, *strategy, socket)
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1, syscall.SIGUSR2)
	for sig := range signals {
		if sig == syscall.SIGUSR1 || sig == syscall.SIGUSR2 {
			p.setHealth(sig == syscall.SIGUSR1)
			log.Printf("%v: every device %s", sig, map[bool]string{true: api.Unhealthy, false: api.Healthy}[sig == syscall.SIGUSR1])
			continue
		}
		break
	}
	close(p.stop)
	server.Stop()
	_ = os.Remove(socket)
	log.Printf("stopped")
}
