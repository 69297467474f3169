"""torchvision: the NMS and deformable convolution functions the hooks replace (``hooks``)."""
