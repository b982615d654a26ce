"""GET /models: every served model, what it reads, how well it does and whether it is ready; GET /model: one
model's card and the providers in use."""

from app.deps import EngineDep, EnginesDep, GivenOnce
from app.engine import Engine
from app.router import Router
from app.schemas import Batching, ModelCard, ModelEntry, Models, errors
from model.card import read_dimensions

router = Router(tags=["models"])


def dimension_labels(card: dict) -> dict[str, list[str]] | None:
    """Each class's dimension labels (the card's dimensions section), what the demo's Fig. 4 sliders say;
    None for a card without the section."""
    section = read_dimensions(card)
    return None if section is None else {c: [e.label for e in dims] for c, dims in section.classes.items()}


def entry(engine: Engine, default: str) -> ModelEntry:
    spec, card = engine.spec, engine.card
    return ModelEntry(
        name=engine.name,
        default=engine.name == default,
        title=card["name"],
        version=engine.version,
        task=spec.task,
        input_size=spec.size,
        preprocessing=spec.preprocessing.kind,
        objects=spec.objects,
        classes=spec.classes,
        accuracy=card.get("test_accuracy"),
        metric=card.get("metric", "accuracy"),
        test_set=card.get("test_set", f"the {card['dataset']} test set"),
        dimensions=dimension_labels(card),
        routing_iterations=spec.routing.iterations if engine.iteration_names else None,
        precision=engine.precision,
        provider=engine.providers[0],
        ready=engine.ready,
        state=engine.state,
    )


@router.get("/models", response_model=Models, summary="Every served model: task, input, classes, accuracy, readiness")
async def models(engines: EnginesDep) -> Models:
    return Models(default=engines.default, models=[entry(engine, engines.default) for engine in engines])


@router.get(
    "/model",
    response_model=ModelCard,
    summary="A model's card and the execution providers in use (?model=)",
    dependencies=[GivenOnce],
    responses=errors(
        {
            404: "no such model",
            422: "a model name that is not one (over 64 characters), or given twice",
            503: "the model is not ready",
        }
    ),
)
async def model(engine: EngineDep) -> ModelCard:
    batching = Batching.model_validate(engine.settings, from_attributes=True)
    return ModelCard(
        **{
            **engine.card,
            "served_as": engine.name,
            "version": engine.version,
            "providers": engine.providers,
            "precision": engine.precision,
            "batching": batching,
        }
    )
