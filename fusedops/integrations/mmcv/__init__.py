"""mmcv: the NMS and deformable convolution functions the hooks replace, by adapters keeping
mmcv's signatures (``hooks``)."""
