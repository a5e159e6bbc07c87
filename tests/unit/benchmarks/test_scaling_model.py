"""The scaling model's arithmetic (benchmarks/scaling_model.py, pure) against values computed by hand,
and its Xception counts against Keras' model and the training job's own block choice (slow)."""
import pytest

from benchmarks import scaling_model as sm


def test_xception_sizes_and_block_14_by_hand():
    layers = sm.xception_layers(299)
    # 299 -> 149 (3x3 stride 2, valid) -> 147 (3x3 valid) -> 74 -> 37 -> 19 (middle flow) -> 10 (block 14)
    assert [l.side for l in layers if l.block == 1 and l.kind == "conv"] == [149, 147]
    assert {l.side for l in layers if 5 <= l.block <= 12} == {19}
    assert {l.side for l in layers if l.block == 14} == {10}
    # block 14: sepconv1 3*3*1024 + 1024*1536, bn 2*1536; sepconv2 3*3*1536 + 1536*2048, bn 2*2048
    assert sm.top_blocks(layers, 1)[0] == 9216 + 1572864 + 3072 + 13824 + 3145728 + 4096 == 4_748_800
    block14_macs = 100 * (9216 + 1572864) + 100 * (13824 + 3145728)
    assert sm.block_totals(layers)[14] == (4_748_800, block14_macs)


def test_xception_totals_match_keras_published_counts():
    layers = sm.xception_layers(299)
    # Keras' Xception(include_top=False): 20,861,480 parameters, 54,528 of them moving statistics
    assert sum(l.trainable for l in layers) == 20_806_952
    assert sum(l.non_trainable for l in layers) == 54_528
    assert len(layers) == 80  # 40 convolutions (36 + 4 residual), each with its batch norm
    assert sm.top_blocks(layers, 14) == (20_806_952, 1.0)
    # block 13 with its residual 1x1 (728*1024 + bn), then blocks 13 and 14 together
    block13 = 728 * 1024 + 2048 + (9 * 728 + 728 * 728) + 1456 + (9 * 728 + 728 * 1024) + 2048
    assert sm.top_blocks(layers, 2)[0] == block13 + 4_748_800 == 6_788_384


def test_two_blocks_and_ten_classes_give_the_benchmarks_measured_bytes():
    """benchmarks.md, scaling with fine-tuning: 6.81 M parameters, 27.24 MB float32 and 13.62 MB float16."""
    params = sm.top_blocks(sm.xception_layers(299), 2)[0] + sm.head_parameters(10)
    assert sm.head_parameters(10) == 2048 * 10 + 10
    assert sm.allreduce_bytes(params, fp16=False) == 27_235_496
    assert sm.allreduce_bytes(params, fp16=True) == 13_617_748


def test_ring_allreduce_cost_by_hand():
    assert sm.ring_allreduce_seconds(1e9, 1, 1e9) == 0.0
    assert sm.ring_allreduce_seconds(1e9, 2, 1e9) == pytest.approx(1.0)   # 2 * 1/2
    assert sm.ring_allreduce_seconds(1e9, 4, 2e9) == pytest.approx(0.75)  # 2 * 3/4 / 2
    assert sm.ring_allreduce_seconds(0, 512, 1e9, 5e-6) == pytest.approx(2 * 511 * 5e-6)
    assert sm.ring_allreduce_seconds(1e9, 4, 1e9, 1e-3) == pytest.approx(1.5 + 0.006)
    with pytest.raises(ValueError):
        sm.ring_allreduce_seconds(1, 0, 1e9)
    with pytest.raises(ValueError):
        sm.ring_allreduce_seconds(1, 2, 0)


def test_efficiency_prediction_and_fit_by_hand():
    assert sm.efficiency(9.0, 1.0) == pytest.approx(0.9)
    frozen = sm.Mode("frozen", 1000, 1.0)
    # compute: 32 images / 3200 images/s + 0 = 10 ms; allreduce: 2 * 7/8 * 4000 B / 1e6 B/s = 7 ms
    p = sm.predict(frozen, 8, "PCIe 4.0 x16", False, 32, 3200.0, 0.0)
    assert p["compute_s"] == pytest.approx(0.010)
    assert p["allreduce_s"] == pytest.approx(2 * 7 / 8 * 4000 / sm.LINKS["PCIe 4.0 x16"])
    assert sm.step_compute_seconds(sm.Mode("cache", 1, 0.0), 32, 3200.0, 0.001) == pytest.approx(0.001)
    assert sm.fit(2, 1.0, 0.25, 1e9) == pytest.approx({"bandwidth": 4e9, "compute_s": 0.75})
    for bad in ((1, 1.0, 0.5), (2, 1.0, 1.0), (2, 1.0, 0.0)):
        with pytest.raises(ValueError):
            sm.fit(*bad, 1e9)


def test_modes_fine_tuning_costs_its_backward_pass():
    two_share = sm.top_blocks(sm.xception_layers(299), 2)[1]
    by_name = {m.name: m for m in sm.modes(257)}
    assert by_name["fine-tune top 2 blocks"].forward_passes == pytest.approx(1 + 2 * two_share)
    assert by_name["fine-tune all 14 blocks"].forward_passes == 3.0
    assert by_name["feature cache (head only)"].forward_passes == 0.0
    assert by_name["frozen backbone (head only)"].parameters == 2048 * 257 + 257


def test_cli_prints_the_tables_and_refuses_bad_input(capsys):
    assert sm.main([]) == 0
    out = capsys.readouterr().out
    assert "| top 2 blocks of the backbone | 6,788,384 |" in out
    assert "512 GPUs (64 hosts)" in out and "NVLink 4 (H100, NVSwitch)" in out
    assert sm.main(["--fit-np", "2", "--fit-step-ms", "1000", "--fit-allreduce-ms", "250",
                    "--fit-bytes", "1e9"]) == 0
    assert "effective allreduce bandwidth 4.00 GB/s, compute 750.0 ms per step" in capsys.readouterr().out
    for argv in (["--image-size", "50"], ["--classes", "0"], ["--fit-np", "2", "--fit-step-ms", "1"]):
        with pytest.raises(SystemExit) as exc:
            sm.main(argv)
        assert exc.value.code == 2


@pytest.mark.slow
def test_block_counts_match_keras_xception_and_the_jobs_block_choice():
    """Every N of --fine-tune-blocks: the model's count equals Keras' trainable parameters after
    the training job's own unfreeze rule (pipelines.training.model.finetune.block_layers)."""
    tf = pytest.importorskip("tensorflow")
    from pipelines.training.model.finetune import block_layers
    from pipelines.backbones import backbone_spec

    base = tf.keras.applications.Xception(weights=None, include_top=False, input_shape=(299, 299, 3))
    assert base.count_params() == 20_861_480
    names = [layer.name for layer in base.layers]
    layers = sm.xception_layers(299)
    for n in range(1, 15):
        chosen = set(block_layers(names, backbone_spec("xception"), n))
        keras_count = sum(int(tf.size(w)) for layer in base.layers if layer.name in chosen
                          for w in layer.trainable_weights)
        assert sm.top_blocks(layers, n)[0] == keras_count, n
