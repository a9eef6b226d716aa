# Upstream's vLLM OpenAI server, mirrored into ECR by `pulumi up` (infra/components/artifacts.py):
# GPU nodes pull it from ECR through the VPC endpoint instead of anonymously from Docker Hub
# through the NAT gateways. The release is infra/config.py's VLLM_VERSION (a test checks it).
FROM vllm/vllm-openai:v0.32.0
