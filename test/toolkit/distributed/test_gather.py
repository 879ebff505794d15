from toolkit.distributed.gather import RankResults, gather_results, merge_results


def rank(keys, skipped=None, frames=0, padding_s=0.0):
    return RankResults(keys=list(keys), hyps={"m": [f"hyp-{k}" for k in keys]}, skipped=skipped or {},
                       num_frames=frames, padding_s=padding_s)


def test_merge_keeps_each_key_once_and_counts_repeats():
    per_rank = [rank(["a", "c"], {"unreadable_audio": 1}, 10, 0.25), rank([]),
                rank(["b", "c", "c"], {"unreadable_audio": 2, "empty_text": 1}, 7, 0.5)]
    per_rank[2].hyps["m"][1] = "a different hypothesis of c"
    job = merge_results(per_rank)
    assert job.hyps == {"m": {"a": "hyp-a", "c": "hyp-c", "b": "hyp-b"}}  # c: rank 0's, the first in rank order
    assert job.owner == {"a": 0, "c": 0, "b": 2}
    assert job.decoded_per_rank == [2, 0, 3] and job.repeated == {"c": 2}
    assert job.skipped == {"unreadable_audio": 3, "empty_text": 1} and job.num_frames == 17
    assert job.padding_s == 0.75


def test_without_a_process_group_gather_is_the_merge_of_one_rank():
    job = gather_results(rank(["x", "y"]))
    assert job.owner == {"x": 0, "y": 0} and job.decoded_per_rank == [2] and job.repeated == {}
