#!/usr/bin/env bash
# End to end on kind, for machines with Docker (it cannot run where CI runs:
# no Docker engine there; the testbed in hack/shoal_testbed plays this part).
# Fake GPUs: each worker node advertises nvidia.com/gpu through a status patch,
# and engine pods run shoal-engine-sim (NOT vLLM: its `vllm serve` entrypoint
# runs `shoal sim` with the same flags; hack/image/engine-sim.Dockerfile).
set -euo pipefail
cd "$(dirname "$0")/.."
cluster=${CLUSTER:-shoal-e2e}
image=${IMAGE:-shoal:dev}
engine_image=${ENGINE_IMAGE:-shoal-engine-sim:dev}

docker build -t "$image" .
docker build -t "$engine_image" --build-arg SHOAL_IMAGE="$image" -f hack/image/engine-sim.Dockerfile .
kind create cluster --name "$cluster" --config - <<'KIND'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes: [{role: control-plane}, {role: worker}, {role: worker}]
KIND
trap 'kind delete cluster --name "$cluster"' EXIT
kind load docker-image "$image" "$engine_image" --name "$cluster"

for node in $(kubectl get nodes -l '!node-role.kubernetes.io/control-plane' -o name); do
  kubectl label "$node" nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3 --overwrite
  kubectl patch "$node" --subresource=status --type=json \
    -p '[{"op":"add","path":"/status/capacity/nvidia.com~1gpu","value":"8"}]'
done

helm install shoal charts/shoal --namespace shoal-system --create-namespace \
  --set image.repository="${image%:*}" --set image.tag="${image#*:}" --wait
helm test shoal --namespace shoal-system

# The stand-in engine image: the operator's engine pod spec (vllm serve ...)
# unchanged. A small fleet of its own (examples/ ask for real GPUs' memory, a
# Hub token and a model download, which kind nodes lack).
kubectl apply -f - <<FLEET
apiVersion: serving.shoal.dev/v1alpha1
kind: VLLMCluster
metadata:
  name: fleet
spec:
  model:
    name: meta-llama/Llama-3.1-8B-Instruct
  image: $engine_image
  replicas: 2
  parallelism:
    tensor: 1
  gpu:
    product: NVIDIA-H100-80GB-HBM3
  engine:
    maxModelLen: 8192
    extraArgs: [--sim-time-scale, "50"]
FLEET
kubectl wait vllmcluster/fleet --for=condition=Ready --timeout=300s
kubectl get vllmclusters

# A request through the router's Service, from a pod (kube-proxy, cluster DNS).
kubectl run client --rm -i --restart=Never --image="$image" --command -- python3 -c '
import httpx
r = httpx.post("http://fleet-router:8000/v1/completions", timeout=30,
               json={"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "hi", "max_tokens": 4})
print(r.status_code, r.text[:200])
assert r.status_code == 200'
