"""DDP scaling benchmarks: data, tokenizer, baseline, one torchrun job per world size, report."""


include: "scaling_helpers.smk"


FAMILY_TARGETS["scaling"] = lambda: final_outputs(
    rules.scaling_summary,
    rules.scaling_figures,
    rules.scaling_report,
    rules.scaling_tables,
)


wildcard_constraints:
    cfg="[A-Za-z0-9_]+",
    world="[0-9]+",


localrules:
    scaling_tables,
    scaling_summary,
    scaling_report,


rule scaling_data:
    input:
        user_files=scaling_data_files,
    output:
        train=f"{SCALING_DIR}/data/{{cfg}}/train.csv",
        val=f"{SCALING_DIR}/data/{{cfg}}/val.csv",
        info=f"{SCALING_DIR}/data/{{cfg}}/data.json",
    log:
        f"{SCALING_DIR}/logs/data/{{cfg}}.log",
    benchmark:
        f"{SCALING_DIR}/benchmarks/data/{{cfg}}.tsv"
    conda:
        CONDA_ENV
    resources:
        **rule_resources("scaling", "scaling_data"),
    params:
        settings=lambda wildcards: scaling_settings(
            wildcards.cfg, {"data": SCALING["configurations"][wildcards.cfg]["data"]}
        ),
    shell:
        "gpuflow scaling-data --name {wildcards.cfg} --settings {params.settings}"
        " --out-train {output.train:q} --out-val {output.val:q} --out-info {output.info:q}"
        " --runtime {resources.runtime_settings} > {log:q} 2>&1"


rule scaling_tokenize:
    input:
        train=f"{SCALING_DIR}/data/{{cfg}}/train.csv",
        val=f"{SCALING_DIR}/data/{{cfg}}/val.csv",
    output:
        tokenizer=f"{SCALING_DIR}/data/{{cfg}}/tokenizer.json",
        train=f"{SCALING_DIR}/data/{{cfg}}/train.npz",
        val=f"{SCALING_DIR}/data/{{cfg}}/val.npz",
        stats=f"{SCALING_DIR}/data/{{cfg}}/tokens.json",
    log:
        f"{SCALING_DIR}/logs/tokenize/{{cfg}}.log",
    benchmark:
        f"{SCALING_DIR}/benchmarks/tokenize/{{cfg}}.tsv"
    conda:
        CONDA_ENV
    resources:
        **rule_resources("scaling", "scaling_tokenize"),
    params:
        settings=scaling_tokenize_settings,
    shell:
        "gpuflow scaling-tokenize --name {wildcards.cfg} --settings {params.settings}"
        " --train {input.train:q} --val {input.val:q}"
        " --out-tokenizer {output.tokenizer:q} --out-train {output.train:q}"
        " --out-val {output.val:q} --out-stats {output.stats:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"


rule scaling_baseline:
    input:
        train=f"{SCALING_DIR}/data/{{cfg}}/train.csv",
        val=f"{SCALING_DIR}/data/{{cfg}}/val.csv",
    output:
        record=f"{SCALING_DIR}/baseline/{{cfg}}.json",
    log:
        f"{SCALING_DIR}/logs/baseline/{{cfg}}.log",
    benchmark:
        f"{SCALING_DIR}/benchmarks/baseline/{{cfg}}.tsv"
    conda:
        CONDA_ENV
    threads: rule_cpus("scaling", "scaling_baseline")
    resources:
        **rule_resources("scaling", "scaling_baseline"),
        **(
            {"slurm_partition": SCALING["baseline"]["slurm_partition"]}
            if SCALING["baseline"]["slurm_partition"]
            else {}
        ),
    params:
        settings=results_json("scaling", {"baseline": SCALING["baseline"]}),
    shell:
        "gpuflow scaling-baseline --name {wildcards.cfg} --train {input.train:q}"
        " --val {input.val:q} --settings {params.settings} --threads {threads}"
        " --out {output.record:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"


rule scaling_train:
    input:
        train=f"{SCALING_DIR}/data/{{cfg}}/train.npz",
        val=f"{SCALING_DIR}/data/{{cfg}}/val.npz",
        info=f"{SCALING_DIR}/data/{{cfg}}/data.json",
        stats=f"{SCALING_DIR}/data/{{cfg}}/tokens.json",
    output:
        run=f"{SCALING_DIR}/runs/{{cfg}}/nodes~1/world~{{world}}/run.json",
        model=f"{SCALING_DIR}/runs/{{cfg}}/nodes~1/world~{{world}}/model.pt",
    log:
        f"{SCALING_DIR}/logs/train/{{cfg}}/nodes~1/world~{{world}}.log",
    benchmark:
        f"{SCALING_DIR}/benchmarks/train/{{cfg}}/nodes~1/world~{{world}}.tsv"
    conda:
        CONDA_ENV
    threads: scaling_train_threads
    resources:
        **scaling_train_resources(),
    params:
        settings=scaling_train_settings,
        cpu_slots=max(SCALING_WORLDS),
    shell:
        "GPUFLOW_GPUS={resources.gpu} gpuflow with-gpus --"
        " python -m torch.distributed.run --standalone --nproc-per-node={wildcards.world}"
        " --max-restarts={resources.max_restarts}"
        " -m gpuflow scaling-train --name {wildcards.cfg}"
        " --train {input.train:q} --val {input.val:q} --data-info {input.info:q}"
        " --token-stats {input.stats:q} --settings {params.settings}"
        " --runtime {resources.runtime_settings} --cpu-slots {params.cpu_slots}"
        " --nccl {resources.nccl}"
        " --out-json {output.run:q} --out-model {output.model:q} > {log:q} 2>&1"


rule scaling_train_multinode:
    input:
        train=f"{SCALING_DIR}/data/{{cfg}}/train.npz",
        val=f"{SCALING_DIR}/data/{{cfg}}/val.npz",
        info=f"{SCALING_DIR}/data/{{cfg}}/data.json",
        stats=f"{SCALING_DIR}/data/{{cfg}}/tokens.json",
    output:
        run=f"{SCALING_DIR}/runs/{{cfg}}/nodes~{SCALING_MULTI['nodes']}/world~{{world}}/run.json",
        model=f"{SCALING_DIR}/runs/{{cfg}}/nodes~{SCALING_MULTI['nodes']}/world~{{world}}/model.pt",
    log:
        f"{SCALING_DIR}/logs/train/{{cfg}}/nodes~{SCALING_MULTI['nodes']}/world~{{world}}.log",
    benchmark:
        f"{SCALING_DIR}/benchmarks/train/{{cfg}}/nodes~{SCALING_MULTI['nodes']}/world~{{world}}.tsv"
    conda:
        CONDA_ENV
    threads: SCALING_TRAIN_CPUS * SCALING_MULTI["gpus_per_node"]
    resources:
        **scaling_multinode_resources(),
    params:
        settings=scaling_train_settings,
        per_node=SCALING_MULTI["gpus_per_node"],
    shell:
        # The head is the node this batch step runs on (the allocation's first); the port is
        # one found free there, for this job (gpuflow.scaling.rendezvous says why).
        "endpoint=$(python -m gpuflow.scaling.rendezvous 2> {log:q});"
        ' GPUFLOW_RENDEZVOUS="$endpoint" {resources.mpi} --nodes={resources.nodes}'
        " --ntasks-per-node=1"
        " --cpus-per-task={resources.cpus_per_task} --gpus-per-node={params.per_node}"
        " --kill-on-bad-exit=1"
        " python -m torch.distributed.run --nnodes={resources.nodes}"
        " --nproc-per-node={params.per_node}"
        " --max-restarts={resources.max_restarts}"
        ' --rdzv-id="$SLURM_JOB_ID" --rdzv-backend=c10d --rdzv-endpoint="$endpoint"'
        " -m gpuflow scaling-train --name {wildcards.cfg}"
        " --train {input.train:q} --val {input.val:q} --data-info {input.info:q}"
        " --token-stats {input.stats:q} --settings {params.settings}"
        " --runtime {resources.runtime_settings} --cpu-slots {params.per_node}"
        " --nccl {resources.nccl}"
        " --out-json {output.run:q} --out-model {output.model:q} >> {log:q} 2>&1"


rule scaling_summary:
    input:
        runs=scaling_runs(),
        baselines=expand(f"{SCALING_DIR}/baseline/{{cfg}}.json", cfg=SCALING_RUN),
    output:
        summary=f"{SCALING_DIR}/comprehensive_summary.csv",
        epochs=f"{SCALING_DIR}/epochs.csv",
        cost=f"{SCALING_DIR}/cost_table.csv",
        tex=f"{SCALING_DIR}/summary_table.tex",
    log:
        f"{SCALING_DIR}/logs/summary.log",
    benchmark:
        f"{SCALING_DIR}/benchmarks/summary.tsv"
    conda:
        CONDA_ENV
    resources:
        **rule_resources("scaling", "scaling_summary"),
    shell:
        "gpuflow scaling-summary --runs {input.runs:q} --baselines {input.baselines:q}"
        " --out-summary {output.summary:q} --out-epochs {output.epochs:q}"
        " --out-cost {output.cost:q} --out-tex {output.tex:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"


rule scaling_figures:
    input:
        summary=f"{SCALING_DIR}/comprehensive_summary.csv",
        epochs=f"{SCALING_DIR}/epochs.csv",
    output:
        epoch_time=report(
            f"{SCALING_DIR}/figures/epoch_time.png",
            caption="../report/scaling_epoch_time.rst",
            category="DDP scaling",
            labels={"figure": "epoch time"},
        ),
        speedup=report(
            f"{SCALING_DIR}/figures/speedup_efficiency.png",
            caption="../report/scaling_speedup.rst",
            category="DDP scaling",
            labels={"figure": "speedup and efficiency"},
        ),
        throughput=report(
            f"{SCALING_DIR}/figures/throughput.png",
            caption="../report/scaling_throughput.rst",
            category="DDP scaling",
            labels={"figure": "throughput"},
        ),
        accuracy=report(
            f"{SCALING_DIR}/figures/accuracy.png",
            caption="../report/scaling_accuracy.rst",
            category="DDP scaling",
            labels={"figure": "validation accuracy"},
        ),
        comm=report(
            f"{SCALING_DIR}/figures/compute_comm.png",
            caption="../report/scaling_compute_comm.rst",
            category="DDP scaling",
            labels={"figure": "compute vs communication"},
        ),
    log:
        f"{SCALING_DIR}/logs/figures.log",
    benchmark:
        f"{SCALING_DIR}/benchmarks/figures.tsv"
    conda:
        CONDA_ENV
    resources:
        **rule_resources("scaling", "scaling_figures"),
    shell:
        "gpuflow scaling-figures --summary {input.summary:q} --epochs {input.epochs:q}"
        " --out-epoch-time {output.epoch_time:q} --out-speedup {output.speedup:q}"
        " --out-throughput {output.throughput:q} --out-accuracy {output.accuracy:q}"
        " --out-comm {output.comm:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"


rule scaling_report:
    input:
        summary=f"{SCALING_DIR}/comprehensive_summary.csv",
        cost=f"{SCALING_DIR}/cost_table.csv",
    output:
        report=report(
            f"{SCALING_DIR}/performance_report.txt",
            caption="../report/scaling_report.rst",
            category="DDP scaling",
            labels={"figure": "performance report"},
        ),
    log:
        f"{SCALING_DIR}/logs/report.log",
    conda:
        CONDA_ENV
    resources:
        runtime_settings=job_json("runtime"),
    params:
        settings=results_json(
            "scaling",
            {"efficiency_target": SCALING["efficiency_target"]},
            job_settings=True,
        ),
    shell:
        "gpuflow scaling-report --summary {input.summary:q} --cost {input.cost:q}"
        " --settings {params.settings} --out {output.report:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"


rule scaling_tables:
    input:
        summary=f"{SCALING_DIR}/comprehensive_summary.csv",
        cost=f"{SCALING_DIR}/cost_table.csv",
    output:
        tables=report(
            f"{SCALING_DIR}/tables.html",
            caption="../report/scaling_tables.rst",
            category="DDP scaling",
            labels={"figure": "summary tables"},
        ),
    log:
        f"{SCALING_DIR}/logs/tables.log",
    conda:
        CONDA_ENV
    resources:
        runtime_settings=job_json("runtime"),
    shell:
        "gpuflow report-tables --csv {input:q} --title 'DDP scaling: summary tables'"
        " --out {output.tables:q} --runtime {resources.runtime_settings} > {log:q} 2>&1"
